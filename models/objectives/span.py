"""T5's span corruption: noise spans of a row replaced by sentinels in the encoder's inputs; the
decoder's targets list each sentinel followed by its span (T5's random_spans_noise_mask arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from models.objectives.base import Args, Objective, ObjectiveParams, Pair
from models.special import SPECIAL, SpecialIds

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


def _span_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row, as T5's random_spans_noise_mask counts them."""
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    return num_noise, min(num_spans, num_noise, length - num_noise)


def span_corruption_lengths(
    inputs_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """(raw tokens length, targets length) so that corrupted inputs are exactly `inputs_length` (T5's
    compute_input_and_target_lengths; EOS counted on both sides)."""

    def lengths(raw: int) -> tuple[int, int]:
        num_noise = int(round(raw * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return raw - num_noise + num_spans + 1, num_noise + num_spans + 1

    raw = inputs_length
    while lengths(raw + 1)[0] <= inputs_length:
        raw += 1
    _, targets_length = lengths(raw)
    if noise_density == 0.5 and targets_length > inputs_length:  # T5 keeps targets at the round number
        raw -= 1
        targets_length -= 1
    return raw, targets_length


def _random_segmentation(num_items: int, num_segments: int, generator: torch.Generator) -> Tensor:
    """Lengths of `num_segments` non-empty segments that add up to `num_items`, uniformly at random."""
    import torch

    first_in_segment = torch.zeros(num_items, dtype=torch.long)
    cuts = torch.randperm(num_items - 1, generator=generator)[: num_segments - 1] + 1
    first_in_segment[cuts] = 1
    segment_id = first_in_segment.cumsum(0)
    return torch.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(
    length: int, noise_density: float, mean_noise_span_length: float, generator: torch.Generator
) -> Tensor:
    """T5's noise mask: alternating non-noise and noise spans, starting with non-noise."""
    import torch

    original_length = length
    length = max(length, 2)  # as T5: at least one noise and one non-noise token
    num_noise, num_spans = _span_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    nonnoise_lengths = _random_segmentation(length - num_noise, num_spans, generator)
    interleaved = torch.stack([nonnoise_lengths, noise_lengths], dim=1).reshape(-1)
    is_noise = torch.repeat_interleave(torch.arange(2 * num_spans) % 2 == 1, interleaved)
    return is_noise[:original_length]


def _replace_spans(row: Tensor, spans: Tensor, first_sentinel: int) -> Tensor:
    """Each run of True in `spans` becomes one sentinel (numbered in order); other tokens are kept."""
    import torch

    starts = spans & ~torch.cat([spans.new_zeros(1), spans[:-1]])
    sentinel_ids = first_sentinel + starts.long().cumsum(0) - 1
    return torch.where(starts, sentinel_ids, row)[~spans | starts]


@dataclass
class SpanBatch:
    input_ids: Tensor  # [B, L_in]: kept tokens, one sentinel per noise span, EOS
    target_ids: Tensor  # [B, L_tgt]: each sentinel followed by its span, EOS


def span_corrupt(
    tokens: Tensor,
    generator: torch.Generator,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    special: SpecialIds = SPECIAL,
) -> SpanBatch:
    import torch

    length = tokens.shape[1]
    _, num_spans = _span_counts(max(length, 2), noise_density, mean_noise_span_length)
    if num_spans > special.n_sentinels:
        raise ValueError(f"{num_spans} noise spans need more than the {special.n_sentinels} sentinels")
    eos = tokens.new_full((1,), special.eos)
    inputs, targets = [], []
    for row in tokens:
        noise = random_spans_noise_mask(length, noise_density, mean_noise_span_length, generator)
        inputs.append(torch.cat([_replace_spans(row, noise, special.first_sentinel), eos]))
        # the mask starts with a kept span, so replacing the kept spans instead puts sentinel k
        # right before noise span k: T5's targets
        targets.append(torch.cat([_replace_spans(row, ~noise, special.first_sentinel), eos]))
    return SpanBatch(torch.stack(inputs), torch.stack(targets))


@dataclass(frozen=True)
class SpanParams(ObjectiveParams):
    noise_density: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mean_span_length: float = field(default=3.0, metadata={"ge": 1.0})


class SpanCorruption(Objective):
    name, kind, Params = "span", "sequence", SpanParams

    def row_length(self, seq_len: int, args: Args) -> int:
        return span_corruption_lengths(seq_len, args["noise_density"], args["mean_span_length"])[0]

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        spans = span_corrupt(rows, generator, args["noise_density"], args["mean_span_length"])
        return Pair(spans.input_ids, spans.target_ids)

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        _, targets = span_corruption_lengths(seq_len, args["noise_density"], args["mean_span_length"])
        return seq_len, targets, targets


OBJECTIVE = SpanCorruption()
