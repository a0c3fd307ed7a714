"""ELMo's biLM (Peters et al., 2018): a forward and a backward LSTM LM (models/specs/architectures/lstm.py,
each its own weights) over the same token embeddings and the same LM head, trained together on
every row: the forward one predicts each next token, the backward one each previous token. Its
features for a task are ELMo's scalar mix of its layers, each the two directions' states side by side
(the embeddings, twice, its layer 0): γ Σ_j softmax(s)_j h_j, s and γ trained with the task."""

from __future__ import annotations

from typing import Any

from models.pair import PairKind
from models.specs.architectures.base import ArchitectureSpec, register
from models.specs.architectures.lstm import check_cells, lstm_flops


class ELMoSpec(ArchitectureSpec):
    name, encoder, decoder = "elmo", True, False
    fits = frozenset({"targets_only"})  # a row read both ways
    poolings = ("mean", "max")  # of the mixed features over the input
    paper_objective, lm_auto_class = "clm", None
    remote_because = "transformers has no ELMo"
    implementation = "models.architectures.elmo"
    positions = ("none",)
    transformer_blocks = False

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        # each direction reads all of the row but one end and predicts the rest
        return targets - 1, 0, 2 * (targets - 1)

    def check_model(self, model: Any) -> None:
        super().check_model(model)
        check_cells(self.name, model)

    def stack_flops(self, model: Any, batch: int, tokens: int) -> tuple[int, int]:
        forward, once = lstm_flops(model, batch, tokens)
        return 2 * forward, 2 * once


ARCHITECTURE = register(ELMoSpec())
