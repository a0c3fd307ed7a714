"""T5's span corruption ("replace corrupted spans"): the noise of a row (spans of a mean length, or
i.i.d. tokens as in T5's objective tables) replaced by one sentinel per span in the inputs; the targets
list each sentinel followed by its span (T5's random_spans_noise_mask arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from models.objectives.base import Args, Objective, ObjectiveParams, Pair
from models.objectives.noise import (
    NoiseMask,
    noise_after_sentinels,
    noise_count,
    noise_mask,
    replace_spans,
    span_counts,
    stacked,
    with_eos,
)

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


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


@dataclass
class SpanBatch:
    input_ids: Tensor  # [B, L_in]: kept tokens, one sentinel per noise span, EOS
    target_ids: Tensor  # [B, L_tgt]: each sentinel followed by its span, EOS
    input_lengths: Tensor | None = None  # where rows differ (i.i.d. noise): each row's real tokens
    target_lengths: Tensor | None = None


def span_corrupt(
    tokens: Tensor,
    generator: torch.Generator,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    mask: NoiseMask = "random_spans",
) -> SpanBatch:
    length = tokens.shape[1]
    inputs, targets = [], []
    for row in tokens:
        noise = noise_mask(mask, length, noise_density, mean_noise_span_length, generator)
        inputs.append(with_eos(replace_spans(row, noise)))
        targets.append(with_eos(noise_after_sentinels(row, noise)))
    (input_ids, input_lengths), (target_ids, target_lengths) = stacked(inputs), stacked(targets)
    return SpanBatch(input_ids, target_ids, input_lengths, target_lengths)


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


class SpanCorruption(Objective):
    name, kind, Params = "span", "sequence", SpanParams

    def row_length(self, seq_len: int, args: Args) -> int:
        if args["noise_mask"] == "iid":  # spans never outnumber noise tokens: inputs fit seq_len
            return seq_len - 1
        return span_corruption_lengths(seq_len, args["noise_density"], args["mean_span_length"])[0]

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        spans = span_corrupt(
            rows, generator, args["noise_density"], args["mean_span_length"], args["noise_mask"]
        )
        return Pair(spans.input_ids, spans.target_ids, spans.input_lengths, spans.target_lengths)

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        if args["noise_mask"] == "iid":
            raw = seq_len - 1
            num_noise = noise_count(raw, args["noise_density"])
            # a noise token starts a span where the token before it is kept (or it is the first)
            spans = num_noise * (raw - num_noise + 1) / raw
            targets = num_noise + spans + 1
            return round(raw - num_noise + spans + 1), round(targets), targets
        _, targets = span_corruption_lengths(seq_len, args["noise_density"], args["mean_span_length"])
        return seq_len, targets, targets

    def longest(self, seq_len: int, args: Args) -> list[tuple[int, int]]:
        if args["noise_mask"] == "iid":
            raw = self.row_length(seq_len, args)
            density = args["noise_density"]
            return [(seq_len, noise_count(raw, density) + most_iid_spans(raw, density) + 1)]
        return super().longest(seq_len, args)


OBJECTIVE = SpanCorruption()
