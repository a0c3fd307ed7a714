"""T5's "drop corrupted tokens" (its Table 4, the best row): the noise of a row (i.i.d. tokens, as T5
drew it, or spans) is removed from the inputs, and the targets are the noise tokens alone, in order."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.objectives.noise import noise_mask, with_eos
from models.pair import Pair
from models.specs.objectives.drop import DropParams


class DropCorrupted(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: DropParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        inputs, targets = [], []
        for row in rows:
            noise = noise_mask(
                params.noise_mask, len(row), params.noise_density, params.mean_span_length, generator
            )
            inputs.append(with_eos(row[~noise]))
            targets.append(with_eos(row[noise]))
        return Pair(torch.stack(inputs), torch.stack(targets))


IMPLEMENTATION = DropCorrupted()
