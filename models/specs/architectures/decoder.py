"""GPT's decoder-only LM: causal self-attention over a pair's inputs and targets concatenated (seqio's
LM feature converter), scored on the targets only; with no inputs, every next token."""

from __future__ import annotations

from models.pair import PairKind
from models.specs.architectures.base import ArchitectureSpec, register


class DecoderSpec(ArchitectureSpec):
    name, encoder, decoder = "decoder", False, True
    fits = frozenset({"sequence", "targets_only"})
    poolings = ("last",)  # the last real token: the only one that has seen the whole input
    finetune_lm_loss = True
    paper_objective, lm_auto_class = "clm", "AutoModelForCausalLM"
    export_classes = ("GPT2LMHeadModel",)
    implementation = "models.architectures.decoder"

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        return 0, inputs + targets - 1, targets - (inputs == 0)


ARCHITECTURE = register(DecoderSpec())
