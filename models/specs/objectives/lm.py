"""T5's prefix LM objective, declared: its params and their bounds, the tokens a row reads and the widths of
its pair (models/objectives/lm.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


def prefix_bounds(length: int, noise_density: float) -> tuple[int, int]:
    """The fewest and most input tokens of a row of `length` (T5's random_prefix_noise_mask)."""
    most = length - 1
    return min(most, max(1, round((1 - 2 * noise_density) * most))), most


@dataclass(frozen=True)
class LMParams(ObjectiveParams):
    noise_density: float = field(
        default=0.5,
        metadata={"gt": 0.0, "lt": 1.0, "description": "the expected fraction of a row that is targets"},
    )


class PrefixLM(ObjectiveSpec):
    name, kind, Params = "lm", "sequence", LMParams
    implementation = "models.objectives.lm"

    def row_length(self, seq_len: int, params: LMParams) -> int:
        return seq_len + 1  # a decoder-only model reads seq_len of them, as with clm

    def widths(self, seq_len: int, params: LMParams) -> tuple[int, int, float]:
        fewest, most = prefix_bounds(seq_len + 1, params.noise_density)
        inputs = (fewest + most) / 2
        return round(inputs), seq_len + 1 - round(inputs), seq_len + 1 - inputs

    def longest(self, seq_len: int, params: LMParams) -> list[tuple[int, int]]:
        fewest, most = prefix_bounds(seq_len + 1, params.noise_density)
        return [(most, seq_len + 1 - most), (fewest, seq_len + 1 - fewest)]


OBJECTIVE = register(PrefixLM())
