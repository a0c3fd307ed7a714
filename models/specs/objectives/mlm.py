"""BERT's masked LM, declared: its params and their bounds, the tokens a row reads and the widths of its pair
(models/objectives/mlm.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from models.specs.objectives.base import (
    ObjectiveParams,
    ObjectiveSpec,
    check_replacement_split,
    register,
)


@dataclass(frozen=True)
class MLMParams(ObjectiveParams):
    mask_rate: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mask_fraction: float = field(default=0.8, metadata={"ge": 0.0, "le": 1.0})
    random_fraction: float = field(default=0.1, metadata={"ge": 0.0, "le": 1.0})
    masking: Literal["dynamic", "static"] = field(
        default="dynamic",
        metadata={
            "description": "dynamic: fresh masks every time a row is read (RoBERTa); static: each row's "
            "masks fixed per copy of the data (BERT's dupe_factor), the copies read in turn, epoch by "
            "epoch (needs pretrain.sampling: epoch)"
        },
    )
    copies: int = field(default=10, metadata={"ge": 1, "description": "static masking's copies (BERT: 10)"})
    mask_unit: Literal["token", "word", "span"] = field(
        default="token",
        metadata={
            "description": "token: BERT's; word: whole words; span: SpanBERT's spans of whole words, "
            "geometric lengths (span_p, max_span); each word or span masked, replaced or kept as a whole"
        },
    )
    span_p: float = field(
        default=0.2, metadata={"gt": 0.0, "le": 1.0, "description": "span: the geometric p"}
    )
    max_span: int = field(default=10, metadata={"ge": 1, "description": "span: the longest span, in words"})
    boundary_loss: bool = field(
        default=False,
        metadata={
            "description": "SpanBERT's span-boundary objective beside the masked LM: each masked token "
            "predicted from the tokens around its span and its offset (mask_unit word or span)"
        },
    )
    pair_loss: Literal["nsp", "sop", "none"] = field(
        default="nsp",
        metadata={
            "description": "on a pair format's [CLS] (pretrain.input_format segment_pair, sentence_pair): "
            "BERT's next-sentence prediction, ALBERT's sentence-order prediction, or none; the other "
            "formats have no pairs and no such loss"
        },
    )

    def check(self) -> None:
        check_replacement_split(self.mask_fraction, self.random_fraction)
        if self.boundary_loss and self.mask_unit == "token":
            raise ValueError("boundary_loss: the span-boundary objective needs spans: mask_unit word or span")
        if self.boundary_loss and self.masking == "static":  # static rows are stacked one by one
            raise ValueError("boundary_loss: the span-boundary objective takes masking: dynamic")


class MaskedLM(ObjectiveSpec):
    name, kind, Params = "mlm", "aligned", MLMParams
    implementation = "models.objectives.mlm"
    pair_formats = True

    def piece_tables(self, params: MLMParams) -> tuple[str, ...]:
        return ("word_starts",) if params.mask_unit != "token" else ()

    def has_head(self, params: MLMParams) -> bool:
        return params.boundary_loss

    def static_copies(self, params: MLMParams) -> int | None:
        return params.copies if params.masking == "static" else None

    def widths(self, seq_len: int, params: MLMParams) -> tuple[int, int, float]:
        return seq_len, seq_len, params.mask_rate * seq_len  # the expected selection


OBJECTIVE = register(MaskedLM())
