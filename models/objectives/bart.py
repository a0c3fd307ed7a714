"""BART's noise functions (its Table 1): the encoder reads a corrupted row, the decoder rebuilds the
whole original. Token masking: i.i.d. tokens become [MASK]; token deletion: they are removed; text
infilling: spans of Poisson(λ) lengths (0 included: a [MASK] inserted) each become one [MASK], so the
model also learns how many tokens are missing; document rotation: the row starts at a random token.
Sentence permutation shuffles the row's sentences before the noise function (fairseq's order), with
or without one (`noise: none`); a sentence ends at a full stop, question or exclamation mark or a
document's end (the tokenizer's `sentence_ends` table, models/pieces.py), where fairseq splits at
GPT-2's full-stop token, and a row's first and last sentences are cut by the row's window."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.objectives.noise import iid_noise_mask, noise_count, stacked, with_eos
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.bart import BartParams


def poisson_span_lengths(num_noise: int, most: int, lam: float, generator: torch.Generator) -> Tensor:
    """Span lengths drawn from Poisson(λ) until they cover `num_noise` tokens, the last one cut to fit
    (fairseq's span-poisson masking); a zero is an insertion. At most `most` spans: zeros go first."""
    draws, total = [], 0
    while total < num_noise:
        draws.append(torch.poisson(torch.full((num_noise + 1,), lam), generator=generator).long())
        total += int(draws[-1].sum())
    lengths = torch.cat(draws)
    covered = lengths.cumsum(0)
    spans = int((covered < num_noise).sum()) + 1
    lengths = lengths[:spans].clone()
    lengths[-1] -= int(covered[spans - 1]) - num_noise
    zeros = (lengths == 0).nonzero().squeeze(1)
    extra = max(0, spans - most)
    if extra:
        keep = torch.ones(spans, dtype=torch.bool)
        keep[zeros[len(zeros) - extra :]] = False
        lengths = lengths[keep]
    return lengths


def text_infilling(row: Tensor, noise_density: float, lam: float, generator: torch.Generator) -> Tensor:
    """The row with Poisson(λ) spans covering `noise_density` of it, each replaced by one [MASK], at
    distinct places between the kept tokens (two spans never merge)."""
    length = len(row)
    num_noise = noise_count(length, noise_density)
    kept = length - num_noise
    lengths = poisson_span_lengths(num_noise, min(num_noise, kept + 1), lam, generator)
    # slot s: before kept token s (s == kept: after the last one)
    slots = torch.randperm(kept + 1, generator=generator)[: len(lengths)].sort().values
    gaps = torch.diff(slots, prepend=slots.new_zeros(1))
    pieces = torch.stack([gaps, lengths], dim=1).reshape(-1)
    counts = torch.cat([pieces, pieces.new_tensor([kept - int(slots[-1])])])
    is_noise = torch.repeat_interleave(torch.arange(len(counts)) % 2 == 1, counts)
    out = torch.full((kept + len(lengths),), SPECIAL.mask, dtype=row.dtype)
    is_mask = torch.zeros(len(out), dtype=torch.bool)
    is_mask[slots + torch.arange(len(slots))] = True
    out[~is_mask] = row[~is_noise]
    return out


def permute_sentences(row: Tensor, ends: Tensor, share: float, generator: torch.Generator) -> Tensor:
    """The row with `share` of its sentences (rounded up) permuted among their places, as fairseq's
    `permute_sentences`; `ends` [vocab] bool marks the pieces that end a sentence (a run of them ends
    one sentence, after its last)."""
    is_end = ends[row]
    is_end[-1] = True
    stops = ((is_end[:-1] & ~is_end[1:]).nonzero().squeeze(1) + 1).tolist() + [len(row)]
    sentences = [row[start:stop] for start, stop in zip([0, *stops[:-1]], stops, strict=True)]
    count = math.ceil(len(sentences) * share)
    chosen = torch.randperm(len(sentences), generator=generator)[:count]
    order = torch.arange(len(sentences))
    order[chosen] = chosen[torch.randperm(count, generator=generator)]
    return torch.cat([sentences[i] for i in order.tolist()])


def noised(row: Tensor, params: BartParams, generator: torch.Generator, pieces: Pieces = NO_PIECES) -> Tensor:
    if params.permute_sentences > 0:
        row = permute_sentences(row, pieces["sentence_ends"], params.permute_sentences, generator)
    noise = params.noise
    if noise == "none":
        return row
    if noise == "document_rotation":
        return torch.roll(row, -int(torch.randint(len(row), (1,), generator=generator)))
    if noise == "text_infilling":
        return text_infilling(row, params.noise_density, params.poisson_lambda, generator)
    chosen = iid_noise_mask(len(row), params.noise_density, generator)
    if noise == "token_deletion":
        return row[~chosen]
    return torch.where(chosen, SPECIAL.mask, row)


class BartDenoising(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: BartParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        inputs, input_lengths = stacked([with_eos(noised(row, params, generator, pieces)) for row in rows])
        return Pair(inputs, torch.stack([with_eos(row) for row in rows]), input_lengths)


IMPLEMENTATION = BartDenoising()
