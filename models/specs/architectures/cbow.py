"""word2vec's CBOW (Mikolov et al., 2013): each position's state is the mean of the embeddings of the
`window` tokens each side of it (not its own), which the tied LM head reads to predict it: a
feed-forward model of a word from its window. It predicts in place (aligned pairs); the order inside
the window is not read, so it takes no positions."""

from __future__ import annotations

from typing import Any

from models.pair import PairKind
from models.specs.architectures.base import ArchitectureSpec, register


class CBOWSpec(ArchitectureSpec):
    name, encoder, decoder = "cbow", True, False
    fits = frozenset({"aligned"})
    poolings = ("mean", "max")  # of the window states over the input: a bag of its words' vectors
    paper_objective, lm_auto_class = "cbow", "AutoModelForMaskedLM"
    remote_because = "transformers has no CBOW model"
    implementation = "models.architectures.cbow"
    positions = ("none",)
    transformer_blocks = False

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        return inputs, 0, predicted

    def stack_flops(self, model: Any, batch: int, tokens: int) -> tuple[int, int]:
        return 0, 0  # window sums by cumulative sums: additions, which neither count nor estimate holds


ARCHITECTURE = register(CBOWSpec())
