"""T5's prefix LM objective ("LM" in its Table 2): each row split at a random point, the prefix the
inputs, the continuation the targets (T5's random_prefix_noise_mask: the inputs take between
round((1 - 2·noise_density)·(L - 1)) and L - 1 tokens, uniformly; noise_density 0.5: 1 to L - 1)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.lm import LMParams, prefix_bounds


def split_rows(rows: Tensor, input_lengths: Tensor) -> Pair:
    """Each row's first `input_lengths[b]` tokens as inputs, the rest as targets, both right-padded."""
    length = rows.shape[1]
    column = torch.arange(length)[None, :]
    target_lengths = length - input_lengths
    inputs = torch.where(column < input_lengths[:, None], rows, SPECIAL.pad)
    shifted = rows.gather(1, (column + input_lengths[:, None]).clamp(max=length - 1))
    targets = torch.where(column < target_lengths[:, None], shifted, SPECIAL.pad)
    return Pair(
        inputs[:, : int(input_lengths.max())],
        targets[:, : int(target_lengths.max())],
        input_lengths,
        target_lengths,
    )


class PrefixLM(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: LMParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        fewest, most = prefix_bounds(rows.shape[1], params.noise_density)
        return split_rows(rows, torch.randint(fewest, most + 1, (len(rows),), generator=generator))


IMPLEMENTATION = PrefixLM()
