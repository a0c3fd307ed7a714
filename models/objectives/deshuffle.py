"""T5's deshuffling (its Table 4): the encoder reads the row's tokens in a random order, the decoder
rebuilds the original. As T5's own code draws it (`permute_noise_tokens` with every token noise), the
permutation is of the whole row, token by token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.objectives.base import Args, Objective, ObjectiveParams, Pair
from models.objectives.noise import with_eos

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True)
class DeshuffleParams(ObjectiveParams):
    """No params: every token of the row is shuffled."""


class Deshuffling(Objective):
    name, kind, Params = "deshuffle", "sequence", DeshuffleParams

    def row_length(self, seq_len: int, args: Args) -> int:
        return seq_len - 1  # and EOS

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        import torch

        shuffled = [row[torch.randperm(len(row), generator=generator)] for row in rows]
        inputs = torch.stack([with_eos(row) for row in shuffled])
        return Pair(inputs, torch.stack([with_eos(row) for row in rows]))

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        return seq_len, seq_len, seq_len


OBJECTIVE = Deshuffling()
