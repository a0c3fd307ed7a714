"""XLNet's permutation language model, declared: its params and their bounds, the tokens a row reads and
the widths of its pair (models/objectives/plm.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


@dataclass(frozen=True)
class PLMParams(ObjectiveParams):
    k: int = field(
        default=6,
        metadata={
            "ge": 2,
            "description": "partial prediction's K: the last 1/K of each factorisation order is predicted, "
            "seq_len // K tokens a row (XLNet-Base: 6 or 7; its code's 85 of 512)",
        },
    )
    span: bool = field(
        default=True,
        metadata={
            "description": "span-based prediction: the predicted tokens in spans of 1 to max_span pieces "
            "from a word start, each span in a context of K times its length (XLNet's `_sample_mask`); "
            "false: single tokens at random"
        },
    )
    max_span: int = field(
        default=5, metadata={"ge": 1, "description": "span: the longest span, in pieces (XLNet: 5)"}
    )
    bidirectional_data: bool = field(
        default=True,
        metadata={
            "description": "XLNet's bi_data: the second half of each batch's rows read their streams "
            "backward, with the distances' encodings negated"
        },
    )

    def predicted(self, seq_len: int) -> int:
        """The tokens predicted a row."""
        return max(1, seq_len // self.k)


class PermutationLM(ObjectiveSpec):
    name, kind, Params = "plm", "aligned", PLMParams
    implementation = "models.objectives.plm"

    def widths(self, seq_len: int, params: PLMParams) -> tuple[int, int, float]:
        return seq_len, seq_len, params.predicted(seq_len)

    def has_head(self, params: PLMParams) -> bool:
        return True  # the query stream and its mask embedding

    def head_takes_memory(self, params: PLMParams) -> bool:
        return True

    def piece_tables(self, params: PLMParams) -> tuple[str, ...]:
        return ("word_starts",) if params.span else ()

    def reversed_rows(self, params: PLMParams, batch_size: int) -> int:
        return batch_size // 2 if params.bidirectional_data else 0

    def model_needs(self, params: PLMParams) -> dict[str, Any]:
        return {"arch": "encoder", "positions": "xl"}


OBJECTIVE = register(PermutationLM())
