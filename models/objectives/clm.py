"""GPT's causal LM: the next token at every position of a row (documents separated by EOS)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import ObjectiveImplementation
from models.pair import Pair
from models.specs.objectives.base import Args


class CausalLM(ObjectiveImplementation):
    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        return Pair(rows[:, :0], rows)


IMPLEMENTATION = CausalLM()
