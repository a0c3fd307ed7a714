"""T5's deshuffling, declared: its params and their bounds, the tokens a row reads and the widths of its pair
(models/objectives/deshuffle.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


@dataclass(frozen=True)
class DeshuffleParams(ObjectiveParams):
    """No params: every token of the row is shuffled."""


class Deshuffling(ObjectiveSpec):
    name, kind, Params = "deshuffle", "sequence", DeshuffleParams
    implementation = "models.objectives.deshuffle"

    def row_length(self, seq_len: int, params: DeshuffleParams) -> int:
        return seq_len - 1  # and EOS

    def widths(self, seq_len: int, params: DeshuffleParams) -> tuple[int, int, float]:
        return seq_len, seq_len, seq_len


OBJECTIVE = register(Deshuffling())
