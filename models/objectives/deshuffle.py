"""T5's deshuffling (its Table 4): the encoder reads the row's tokens in a random order, the decoder
rebuilds the original. As T5's own code draws it (`permute_noise_tokens` with every token noise), the
permutation is of the whole row, token by token."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.objectives.noise import with_eos
from models.pair import Pair
from models.specs.objectives.deshuffle import DeshuffleParams


class Deshuffling(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: DeshuffleParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        shuffled = [row[torch.randperm(len(row), generator=generator)] for row in rows]
        inputs = torch.stack([with_eos(row) for row in shuffled])
        return Pair(inputs, torch.stack([with_eos(row) for row in rows]))


IMPLEMENTATION = Deshuffling()
