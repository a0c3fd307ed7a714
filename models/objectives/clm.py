"""GPT's causal LM: the next token at every position of a row (documents separated by EOS)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.pair import Pair
from models.specs.objectives.base import ObjectiveParams


class CausalLM(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: ObjectiveParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        return Pair(rows[:, :0], rows)


IMPLEMENTATION = CausalLM()
