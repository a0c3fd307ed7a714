"""T5's span corruption, declared: its params and their bounds, the tokens a row reads and the widths of
its pair (models/objectives/span.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register
from models.specs.objectives.noise import NoiseMask, noise_count, span_counts


def span_corruption_lengths(
    inputs_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """(raw tokens length, targets length) so that corrupted inputs are exactly `inputs_length` (T5's
    compute_input_and_target_lengths; EOS counted on both sides). The spans are counted as the mask
    counts them (at least one: T5's helper rounds 22 noise tokens in spans of 64 to none, one more
    input token than its mask then makes)."""

    def lengths(raw: int) -> tuple[int, int]:
        num_noise, num_spans = span_counts(raw, noise_density, mean_noise_span_length)
        return raw - num_noise + num_spans + 1, num_noise + num_spans + 1

    raw = inputs_length
    while lengths(raw + 1)[0] <= inputs_length:
        raw += 1
    _, targets_length = lengths(raw)
    if noise_density == 0.5 and targets_length > inputs_length:  # T5 keeps targets at the round number
        raw -= 1
        targets_length -= 1
    return raw, targets_length


def most_iid_spans(length: int, noise_density: float) -> int:
    """The most spans i.i.d. noise makes of a row: every noise token its own, a kept one between."""
    num_noise = noise_count(length, noise_density)
    return min(num_noise, length - num_noise + 1)


@dataclass(frozen=True)
class SpanParams(ObjectiveParams):
    noise_density: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mean_span_length: float = field(
        default=3.0, metadata={"ge": 1.0, "description": "random_spans: the mean noise span"}
    )
    noise_mask: NoiseMask = field(
        default="random_spans",
        metadata={"description": "random_spans: T5's final objective; iid: its objective tables"},
    )


class SpanCorruption(ObjectiveSpec):
    name, kind, Params = "span", "sequence", SpanParams
    implementation = "models.objectives.span"

    def row_length(self, seq_len: int, params: SpanParams) -> int:
        if params.noise_mask == "iid":  # spans never outnumber noise tokens: inputs fit seq_len
            return seq_len - 1
        return span_corruption_lengths(seq_len, params.noise_density, params.mean_span_length)[0]

    def widths(self, seq_len: int, params: SpanParams) -> tuple[int, int, float]:
        if params.noise_mask == "iid":
            raw = seq_len - 1
            num_noise = noise_count(raw, params.noise_density)
            # a noise token starts a span where the token before it is kept (or it is the first)
            spans = num_noise * (raw - num_noise + 1) / raw
            targets = num_noise + spans + 1
            return round(raw - num_noise + spans + 1), round(targets), targets
        _, targets = span_corruption_lengths(seq_len, params.noise_density, params.mean_span_length)
        return seq_len, targets, targets

    def longest(self, seq_len: int, params: SpanParams) -> list[tuple[int, int]]:
        if params.noise_mask == "iid":
            raw = self.row_length(seq_len, params)
            density = params.noise_density
            return [(seq_len, noise_count(raw, density) + most_iid_spans(raw, density) + 1)]
        return super().longest(seq_len, params)


OBJECTIVE = register(SpanCorruption())
