"""T5's deshuffling (its Table 4): the encoder reads the row's tokens in a random order, the decoder
rebuilds the original. As T5's own code draws it (`permute_noise_tokens` with every token noise), the
permutation is of the whole row, token by token."""

from __future__ import annotations

from dataclasses import dataclass

from models.specs.objectives.base import Args, ObjectiveParams, ObjectiveSpec, register


@dataclass(frozen=True)
class DeshuffleParams(ObjectiveParams):
    """No params: every token of the row is shuffled."""


class Deshuffling(ObjectiveSpec):
    name, kind, Params = "deshuffle", "sequence", DeshuffleParams
    implementation = "models.objectives.deshuffle"

    def row_length(self, seq_len: int, args: Args) -> int:
        return seq_len - 1  # and EOS

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        return seq_len, seq_len, seq_len


OBJECTIVE = register(Deshuffling())
