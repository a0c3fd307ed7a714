"""T5's prefix LM: a decoder-only LM over a pair's inputs and targets concatenated (seqio's prefix-LM
feature converter) that attends fully within the inputs part, causally after it; scored on the
targets only. An aligned pair (a masked LM) is all prefix: UniLM's bidirectional mask in the same
model. Fine-tuning reads the whole input as the prefix."""

from __future__ import annotations

from models.pair import PairKind
from models.specs.architectures.base import ArchitectureSpec, register


class PrefixLMSpec(ArchitectureSpec):
    name, encoder, decoder, prefix = "prefix_lm", False, True, True
    fits = frozenset({"aligned", "sequence", "targets_only"})
    # the last real token (the one the LM objective trained to start the continuation), or the mean or
    # max of the states: with the input as the prefix, every position has seen all of it
    poolings = ("last", "mean", "max")
    paper_objective, lm_auto_class = "lm", "AutoModelForCausalLM"
    remote_because = "no transformers decoder attends fully within a prefix"
    implementation = "models.architectures.prefix_lm"

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        if kind == "aligned":  # the inputs alone, all of them the prefix
            return 0, inputs, predicted
        return 0, inputs + targets - 1, targets - (inputs == 0)


ARCHITECTURE = register(PrefixLMSpec())
