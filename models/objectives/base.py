"""What a pretraining objective is, and the random stream its batches draw from.

As in T5's own code, an objective only makes `(inputs, targets)` from a batch of rows of tokens; the
architecture's feature converter (models/architectures) turns that pair into its batch. So any
objective trains any architecture whose converter can express the pair's kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, get_origin, get_type_hints

from models.pair import Pair, PairKind

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from models.config import ModelConfig

Args = Mapping[str, Any]  # params.yaml `objectives.<name>`


@dataclass(frozen=True)
class ObjectiveParams:
    """An objective's section of params.yaml (`objectives.<name>`): its fields, their bounds and
    description in each field's metadata (lmpipe/params/pretrain.py builds the schema from them, as
    lmpipe/params/models.py does from models/config.py; models/ needs no pydantic)."""

    def check(self) -> None:
        """Rules across fields: a ValueError says which is broken."""

    def validate(self) -> None:
        """Each field within its metadata's bounds and, if a Literal, one of its values (what the
        params schema checks, for params given elsewhere: a mixture's components)."""
        hints = get_type_hints(type(self))
        for spec in fields(self):
            value, bounds = getattr(self, spec.name), spec.metadata
            if value is None:  # an optional field left unset: no bound applies
                continue
            if get_origin(hints[spec.name]) is Literal and value not in get_args(hints[spec.name]):
                raise ValueError(
                    f"{spec.name}: {value!r} is not one of {', '.join(get_args(hints[spec.name]))}"
                )
            broken = [
                f"{word} {bounds[key]}"
                for key, word, holds in (
                    ("gt", ">", lambda v, b: v > b),
                    ("ge", ">=", lambda v, b: v >= b),
                    ("lt", "<", lambda v, b: v < b),
                    ("le", "<=", lambda v, b: v <= b),
                )
                if key in bounds and not holds(value, bounds[key])
            ]
            if broken:
                raise ValueError(f"{spec.name}: {value!r} must be {' and '.join(broken)}")


@dataclass
class Terms:
    """What a pretraining step computes: the objective's token loss (validation's `val/loss`), its
    correct predictions and predicted tokens; losses beside it, each with its weight in the step's
    sum (a pair loss, ELECTRA's replaced-token detection), accuracies logged by name, and other
    shares logged by name (ELECTRA's replaced share and recall: what its accuracy is read against)."""

    loss: Tensor
    correct: Tensor
    count: int
    extra: dict[str, tuple[Tensor, float]] = field(default_factory=dict)
    accuracies: dict[str, Tensor] = field(default_factory=dict)
    rates: dict[str, Tensor] = field(default_factory=dict)

    def logged(self) -> dict[str, Tensor]:
        """What is logged beside the token loss, by metric name: each extra loss, accuracy and share."""
        losses = {f"{name}_loss": loss.detach() for name, (loss, _) in self.extra.items()}
        accuracies = {f"{name}_accuracy": accuracy for name, accuracy in self.accuracies.items()}
        return losses | accuracies | self.rates

    def total(self) -> Tensor:
        """What the step minimises: the token loss and the weighted extra losses."""
        return self.loss + sum(weight * loss for loss, weight in self.extra.values())


class Objective(ABC):
    """A pretraining objective: the tokens a row reads, the pair it makes of rows, and the widths of
    that pair (what the FLOPs count needs)."""

    name: ClassVar[str]
    kind: ClassVar[PairKind | None]  # None: a mixture, its components' kinds
    Params: ClassVar[type[ObjectiveParams]] = ObjectiveParams
    trains_lm_head: ClassVar[bool] = True  # the model's tied LM head: what its export's LM class runs

    def components(self, args: Args) -> list[tuple[float, Objective, Args]]:
        """(share, objective, its args) of what makes a batch: this objective, or a mixture's parts."""
        return [(1.0, self, args)]

    def static_copies(self, args: Args) -> int | None:
        """With static masking (BERT's `dupe_factor`), the copies of the data: every row's noise drawn
        once per copy and reused whenever that copy is read; None: fresh noise every batch (dynamic)."""
        return None

    def row_length(self, seq_len: int, args: Args) -> int:
        """Tokens read per row for inputs of `seq_len`."""
        return seq_len

    @abstractmethod
    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair: ...

    def has_head(self, args: Args) -> bool:
        """Whether `head` builds a module (what params validation asks, without torch)."""
        return False

    def head(self, model: ModelConfig, args: Args) -> nn.Module | None:
        """A pretraining-only module that computes the step's `Terms` from the model and the batch in
        place of the LM head (ELECTRA's generator and discriminator head), trained beside the model and
        left out of its export; None: the model's tied LM head on the pair's targets."""
        return None

    def example_extras(self, predicted: int, args: Args) -> dict[str, Tensor]:
        """The pair's `extras` for a batch of `predicted` scored tokens, on the meta device (the FLOPs
        count's example batch)."""
        return {}

    def piece_tables(self, args: Args) -> tuple[str, ...]:
        """The tokenizer's piece tables that `pair` reads from its args by name (models/pieces.py:
        `word_starts`, `sentence_ends`), which `make_batch` adds to the args."""
        return ()

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, args: Args) -> int | None:
        """The forward FLOPs of `head` beside the model's stacks (which it runs once), for the
        estimate; None: the tied LM head on the predicted tokens."""
        return None

    @abstractmethod
    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        """(inputs width, targets width, predicted tokens per row): exact for fixed-width pairs, the
        expectation where rows differ."""

    def longest(self, seq_len: int, args: Args) -> list[tuple[int, int]]:
        """The widest (inputs, targets) a row can make, what the model's max_len must hold (bounds, or
        the extremes where one grows as the other shrinks)."""
        inputs, targets, _ = self.widths(seq_len, args)
        return [(inputs, targets)]


def batch_generator(seed: int, index: int) -> torch.Generator:
    """The RNG of one micro-batch by its index across processes (micro-step × processes + rank): the
    same masks whichever DataLoader worker builds it (any number of workers, a resume at any step), and
    W processes see the micro-batches that one process accumulating W of them would."""
    import torch

    from models.training import derived_seed  # it imports torch

    return torch.Generator().manual_seed(derived_seed(seed, index))
