"""word2vec's CBOW objective, declared: every token of a row predicted from its window (the `cbow`
architecture leaves each position's own token out of its state), no token replaced."""

from __future__ import annotations

from typing import Any

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


class ContinuousBagOfWords(ObjectiveSpec):
    name, kind = "cbow", "aligned"
    implementation = "models.objectives.cbow"

    def widths(self, seq_len: int, params: ObjectiveParams) -> tuple[int, int, float]:
        return seq_len, seq_len, seq_len  # the specials of a row are not predicted: a bound

    def model_needs(self, params: ObjectiveParams) -> dict[str, Any]:
        return {"arch": "cbow"}  # any other aligned architecture sees the token it predicts


OBJECTIVE = register(ContinuousBagOfWords())
