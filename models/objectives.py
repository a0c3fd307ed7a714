"""The three pretraining objectives as pure, seeded tensor functions (no model needed).

MLM (BERT): select non-special tokens at `rate`; of those 80 % -> [MASK], 10 % -> a random token,
10 % kept. CLM (GPT): next token on every position. Span corruption (T5): noise spans replaced by
sentinels in the inputs, the targets list each sentinel followed by its span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.special import SPECIAL, SpecialIds
from models.training import derived_seed


def batch_generator(seed: int, index: int) -> torch.Generator:
    """The RNG of one micro-batch by its index across processes (micro-step × processes + rank): the
    same masks whichever DataLoader worker builds it (any number of workers, a resume at any step), and
    W processes see the micro-batches that one process accumulating W of them would."""
    return torch.Generator().manual_seed(derived_seed(seed, index))


@dataclass
class MaskedBatch:
    input_ids: Tensor  # [B, T] with the selected tokens replaced
    positions: Tensor  # [N] flat indices into B*T of the selected tokens, ascending
    labels: Tensor  # [N] the original tokens there


def mask_tokens(
    tokens: Tensor,
    generator: torch.Generator,
    vocab_size: int,
    rate: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    special: SpecialIds = SPECIAL,
) -> MaskedBatch:
    if not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be in (0, 1), got {rate}")
    if mask_fraction < 0 or random_fraction < 0 or mask_fraction + random_fraction > 1.0:
        raise ValueError(
            f"mask_fraction ({mask_fraction}) and random_fraction ({random_fraction}) must be >= 0 "
            "and sum to at most 1"
        )
    if vocab_size <= special.n_special:
        raise ValueError(f"vocab_size ({vocab_size}) must exceed the {special.n_special} special ids")
    flat = tokens.reshape(-1)
    selected = (torch.rand(flat.shape, generator=generator) < rate) & (flat >= special.n_special)
    positions = selected.nonzero().squeeze(1)
    labels = flat[positions]
    choice = torch.rand(positions.shape, generator=generator)
    random_ids = torch.randint(special.n_special, vocab_size, positions.shape, generator=generator)
    replaced = torch.where(
        choice < mask_fraction,
        torch.full_like(labels, special.mask),
        torch.where(choice < mask_fraction + random_fraction, random_ids, labels),
    )
    inputs = flat.clone()
    inputs[positions] = replaced
    return MaskedBatch(inputs.view_as(tokens), positions, labels)


def causal_lm_batch(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets of [B, T+1] rows; documents in a row are separated by EOS."""
    return tokens[:, :-1], tokens[:, 1:]


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
    first_in_segment = torch.zeros(num_items, dtype=torch.long)
    cuts = torch.randperm(num_items - 1, generator=generator)[: num_segments - 1] + 1
    first_in_segment[cuts] = 1
    segment_id = first_in_segment.cumsum(0)
    return torch.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(
    length: int, noise_density: float, mean_noise_span_length: float, generator: torch.Generator
) -> Tensor:
    """T5's noise mask: alternating non-noise and noise spans, starting with non-noise."""
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
