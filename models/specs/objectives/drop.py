"""T5's "drop corrupted tokens", declared: its params and their bounds, the tokens a row reads and the
widths of its pair (models/objectives/drop.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register
from models.specs.objectives.noise import NoiseMask, noise_count


def raw_length(seq_len: int, noise_density: float) -> int:
    """The longest row whose kept tokens and EOS fit `seq_len` inputs."""
    raw = seq_len
    while raw + 1 - noise_count(raw + 1, noise_density) + 1 <= seq_len:
        raw += 1
    return raw


@dataclass(frozen=True)
class DropParams(ObjectiveParams):
    noise_density: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    noise_mask: NoiseMask = field(
        default="iid", metadata={"description": "iid: T5's objective tables; random_spans: spans"}
    )
    mean_span_length: float = field(
        default=3.0, metadata={"ge": 1.0, "description": "random_spans: the mean noise span"}
    )


class DropCorrupted(ObjectiveSpec):
    name, kind, Params = "drop", "sequence", DropParams
    implementation = "models.objectives.drop"

    def row_length(self, seq_len: int, params: DropParams) -> int:
        return raw_length(seq_len, params.noise_density)

    def widths(self, seq_len: int, params: DropParams) -> tuple[int, int, float]:
        raw = self.row_length(seq_len, params)
        num_noise = noise_count(raw, params.noise_density)
        return raw - num_noise + 1, num_noise + 1, num_noise + 1


OBJECTIVE = register(DropCorrupted())
