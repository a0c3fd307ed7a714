"""T5's "BERT-style" objective, declared: its params and their bounds, the tokens a row reads and the
widths of its pair (models/objectives/bert_style.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.specs.objectives.base import (
    ObjectiveParams,
    ObjectiveSpec,
    check_replacement_split,
    register,
)
from models.specs.objectives.noise import NoiseMask


@dataclass(frozen=True)
class BertStyleParams(ObjectiveParams):
    noise_density: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mask_fraction: float = field(default=0.8, metadata={"ge": 0.0, "le": 1.0})
    random_fraction: float = field(default=0.1, metadata={"ge": 0.0, "le": 1.0})
    noise_mask: NoiseMask = field(
        default="iid", metadata={"description": "iid: T5's objective tables; random_spans: spans"}
    )
    mean_span_length: float = field(
        default=3.0, metadata={"ge": 1.0, "description": "random_spans: the mean noise span"}
    )

    def check(self) -> None:
        check_replacement_split(self.mask_fraction, self.random_fraction)


class BertStyle(ObjectiveSpec):
    name, kind, Params = "bert_style", "sequence", BertStyleParams
    implementation = "models.objectives.bert_style"

    def row_length(self, seq_len: int, params: BertStyleParams) -> int:
        return seq_len - 1  # and EOS

    def widths(self, seq_len: int, params: BertStyleParams) -> tuple[int, int, float]:
        return seq_len, seq_len, seq_len


OBJECTIVE = register(BertStyle())
