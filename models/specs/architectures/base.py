"""What an architecture declares: the stacks it builds, the pairs its converter takes, its poolings for
fine-tuning, its tokens per row for the FLOPs count and its transformers classes; and where its
implementation is (models/architectures). No torch: every stage imports the declarations."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from models.pair import PairKind


class ArchitectureSpec(ABC):
    name: ClassVar[str]
    encoder: ClassVar[bool]  # builds a bidirectional encoder stack
    decoder: ClassVar[bool]  # builds a causal decoder stack (cross-attending to the encoder, if any)
    prefix: ClassVar[bool] = False  # a decoder that attends fully within a prefix (prefix_lengths)
    fits: ClassVar[frozenset[PairKind]]  # the pairs its converter can express
    poolings: ClassVar[tuple[str, ...]]  # fine-tuning's choices, the default first
    # its fine-tuning reads the input as a causal LM, so GPT-1's auxiliary LM loss applies to it
    # (`pooled_and_lm_loss`, `finetune.common.lm_loss_weight`)
    finetune_lm_loss: ClassVar[bool] = False
    paper_objective: ClassVar[str]  # the objective the paper that made it trained it with
    # the transformers Auto class of its LM head (a remote-code export); None: it exports no LM class
    # (ELMo's two LMs read the row both ways, which no transformers LM class does)
    lm_auto_class: ClassVar[str | None]
    # the transformers classes that compute what it does in some configuration, tried in this order
    # (models/hf_classes.py: REQUIRES says which configuration each needs); else the export is remote
    # code, and `remote_because` says why no class has it
    export_classes: ClassVar[tuple[str, ...]] = ()
    remote_because: ClassVar[str] = ""
    implementation: ClassVar[str]  # the module of its implementation, a subclass of this declaration
    # its stacks are transformer blocks: the fine-tuning methods that add to attention or the MLP fit it
    transformer_blocks: ClassVar[bool] = True
    # the positions it takes (None: any); a recurrent stack reads the order itself
    positions: ClassVar[tuple[str, ...] | None] = None

    def check_model(self, model: Any) -> None:
        """Its own rules on a ModelConfig's fields (the positions it takes): a ValueError names the field."""
        if self.positions is not None and model.positions not in self.positions:
            raise ValueError(
                f"positions: arch {self.name} takes {' or '.join(self.positions)}, not {model.positions}"
            )

    def stack_flops(self, model: Any, batch: int, tokens: int) -> tuple[int, int] | None:
        """(forward FLOPs, forward FLOPs whose backward costs them once) of its stacks over `tokens` a
        row, beside the LM head, where they are not the transformer stacks models/flops.py estimates
        (`model`: a ModelConfig); None: those."""
        return None

    @abstractmethod
    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        """(encoder tokens, decoder tokens, predicted tokens) per row of a pair of this kind and widths."""


ARCHITECTURES: dict[str, ArchitectureSpec] = {}  # by name: models/specs/architectures/__init__.py


def register(architecture: ArchitectureSpec) -> ArchitectureSpec:
    """Add an architecture to the registry (what its declaration module does as it is imported):
    params.yaml's `models.<name>.arch` may name it."""
    ARCHITECTURES[architecture.name] = architecture
    return architecture
