"""GPT's causal LM: the next token at every position of a row (documents separated by EOS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.objectives.base import Args, Objective, Pair

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


class CausalLM(Objective):
    name, kind = "clm", "targets_only"

    def row_length(self, seq_len: int, args: Args) -> int:
        return seq_len + 1  # a decoder reads seq_len of them and predicts each one's next

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        return Pair(rows[:, :0], rows)

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        return 0, seq_len + 1, seq_len


OBJECTIVE = CausalLM()
