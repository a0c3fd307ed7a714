"""word2vec's CBOW objective: every non-special token of a row is a target in place, the inputs the row
itself; the `cbow` architecture predicts each from its window alone."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.base import ObjectiveParams


class ContinuousBagOfWords(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: ObjectiveParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        return Pair(rows, rows, noise=rows >= SPECIAL.n_special)


IMPLEMENTATION = ContinuousBagOfWords()
