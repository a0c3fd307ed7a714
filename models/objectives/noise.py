"""T5's denoising building blocks (t5.data.preprocessors: `denoise` and its noise masks, inputs and
targets encodings), pure functions of a row and a seeded generator, that the denoising objectives
combine: which tokens are noise (i.i.d. or spans of a mean length), what the inputs make of them (one
sentinel per span, the mask token, BERT's random replacement, nothing), what the targets hold (the
noise after its sentinels, the noise alone, the whole original)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.special import SPECIAL
from models.specs.objectives.noise import NoiseMask, noise_count, span_counts

LAST_SENTINEL = SPECIAL.first_sentinel + SPECIAL.n_sentinels - 1


def random_segmentation(num_items: int, num_segments: int, generator: torch.Generator) -> Tensor:
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
    num_noise, num_spans = span_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = random_segmentation(num_noise, num_spans, generator)
    nonnoise_lengths = random_segmentation(length - num_noise, num_spans, generator)
    interleaved = torch.stack([nonnoise_lengths, noise_lengths], dim=1).reshape(-1)
    is_noise = torch.repeat_interleave(torch.arange(2 * num_spans) % 2 == 1, interleaved)
    return is_noise[:original_length]


def iid_noise_mask(length: int, noise_density: float, generator: torch.Generator) -> Tensor:
    """Each token noise independently of its neighbours (T5's iid_noise_mask), `noise_count` of them:
    T5 draws a Bernoulli per token; a fixed count keeps every pair within widths the model is checked
    against (`Objective.longest`) and changes no token's chance of being noise."""
    chosen = torch.randperm(length, generator=generator)[: noise_count(length, noise_density)]
    return torch.zeros(length, dtype=torch.bool).index_fill_(0, chosen, True)


def noise_mask(
    kind: NoiseMask, length: int, noise_density: float, mean_span_length: float, generator: torch.Generator
) -> Tensor:
    if kind == "iid":
        return iid_noise_mask(length, noise_density, generator)
    return random_spans_noise_mask(length, noise_density, mean_span_length, generator)


def span_starts(noise: Tensor) -> Tensor:
    """True where a run of noise begins."""
    return noise & ~torch.cat([noise.new_zeros(1), noise[:-1]])


def sentinel_ids(starts: Tensor) -> Tensor:
    """At each span start, its sentinel: the k-th span's is sentinel k; spans past the last sentinel
    share it (T5's own numbering runs on into ordinary vocabulary ids there: a long row at a high
    corruption rate, 128 spans at 512 tokens and 50 %, has more spans than its 100 sentinels)."""
    return (SPECIAL.first_sentinel + starts.long().cumsum(0) - 1).clamp(max=LAST_SENTINEL)


def replace_spans(row: Tensor, spans: Tensor) -> Tensor:
    """Each run of True in `spans` becomes its sentinel; the other tokens are kept."""
    starts = span_starts(spans)
    return torch.where(starts, sentinel_ids(starts), row)[~spans | starts]


def noise_after_sentinels(row: Tensor, noise: Tensor) -> Tensor:
    """The noise tokens alone, each span after its sentinel (as `replace_spans` numbers them in the
    inputs): T5's targets, which its nonnoise_span_to_unique_sentinel makes of a mask that starts with
    kept tokens."""
    starts = span_starts(noise)
    sentinels = torch.where(starts, sentinel_ids(starts), -1)
    kept = torch.where(noise, row, -1)
    flat = torch.stack([sentinels, kept], dim=1).reshape(-1)
    return flat[flat >= 0]


def mask_or_random(
    row: Tensor,
    noise: Tensor,
    mask_fraction: float,
    random_fraction: float,
    vocab_size: int,
    generator: torch.Generator,
) -> Tensor:
    """Each noise token becomes the mask token (`mask_fraction`), a random non-special token
    (`random_fraction`) or stays itself (the rest): BERT's 80/10/10 (T5's
    noise_token_to_random_token_or_sentinel is 90/10, MASS-style 100/0)."""
    choice = torch.rand(row.shape, generator=generator)
    random_ids = torch.randint(SPECIAL.n_special, vocab_size, row.shape, generator=generator)
    return torch.where(noise, bert_replacement(row, choice, random_ids, mask_fraction, random_fraction), row)


def bert_replacement(
    tokens: Tensor, choice: Tensor, random_ids: Tensor, mask_fraction: float, random_fraction: float
) -> Tensor:
    """BERT's rule for a selected token, by its uniform draw `choice`: below `mask_fraction` the mask
    token, below `mask_fraction + random_fraction` its random id, else the token itself (80/10/10)."""
    return torch.where(
        choice < mask_fraction,
        torch.full_like(tokens, SPECIAL.mask),
        torch.where(choice < mask_fraction + random_fraction, random_ids, tokens),
    )


def with_eos(row: Tensor) -> Tensor:
    return torch.cat([row, row.new_full((1,), SPECIAL.eos)])


def stacked(rows: list[Tensor]) -> tuple[Tensor, Tensor | None]:
    """Rows of tokens as one right-padded tensor, and their lengths (None when all are as long)."""
    lengths = torch.tensor([len(row) for row in rows])
    if bool((lengths == lengths[0]).all()):
        return torch.stack(rows), None
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=SPECIAL.pad), lengths
