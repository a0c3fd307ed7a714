"""T5's span corruption ("replace corrupted spans"): the noise of a row (spans of a mean length, or
i.i.d. tokens as in T5's objective tables) replaced by one sentinel per span in the inputs; the targets
list each sentinel followed by its span (T5's random_spans_noise_mask arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.objectives.noise import (
    noise_after_sentinels,
    noise_mask,
    replace_spans,
    stacked,
    with_eos,
)
from models.pair import Pair
from models.specs.objectives.noise import NoiseMask
from models.specs.objectives.span import SpanParams


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


class SpanCorruption(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: SpanParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        spans = span_corrupt(
            rows, generator, params.noise_density, params.mean_span_length, params.noise_mask
        )
        return Pair(spans.input_ids, spans.target_ids, spans.input_lengths, spans.target_lengths)


IMPLEMENTATION = SpanCorruption()
