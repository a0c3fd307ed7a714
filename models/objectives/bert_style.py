"""T5's "BERT-style" objective (its Table 4, "predict all"): the noise of a row (i.i.d. tokens, as T5
drew it, or spans) becomes [MASK], a random token or stays itself (BERT's 80/10/10); the targets are the
whole original row. With `mask_fraction` 1 and `random_fraction` 0 it is T5's "MASS-style" row."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.objectives.noise import mask_or_random, noise_mask
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.bert_style import BertStyleParams


class BertStyle(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: BertStyleParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        kind, density, mean = params.noise_mask, params.noise_density, params.mean_span_length
        noise = torch.stack([noise_mask(kind, rows.shape[1], density, mean, generator) for _ in rows])
        split = params.mask_fraction, params.random_fraction
        inputs = mask_or_random(rows, noise, *split, vocab_size, generator)
        eos = rows.new_full((len(rows), 1), SPECIAL.eos)
        return Pair(torch.cat([inputs, eos], dim=1), torch.cat([rows, eos], dim=1))


IMPLEMENTATION = BertStyle()
