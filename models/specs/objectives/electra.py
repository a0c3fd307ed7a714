"""ELECTRA's replaced-token detection, declared: its params and their bounds, the tokens a row reads and
the widths of its pair (models/objectives/electra.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


@dataclass(frozen=True)
class ElectraParams(ObjectiveParams):
    mask_rate: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mask_fraction: float = field(
        default=0.85, metadata={"ge": 0.0, "le": 1.0, "description": "of the selected: [MASK]; the rest kept"}
    )
    generator_width: float = field(
        default=0.25,
        metadata={
            "gt": 0.0,
            "le": 1.0,
            "description": "the generator's width, heads and MLP as a fraction of the discriminator's (its "
            "depth is the discriminator's; ELECTRA: 1/4)",
        },
    )
    generator_head: Literal["transform", "tied"] = field(
        default="transform",
        metadata={
            "description": "the generator's prediction head: transform (ELECTRA's: dense to the embeddings' "
            "width, GELU, LayerNorm, output bias) | tied (back through the input projection's matrix)"
        },
    )
    discriminator_weight: float = field(
        default=50.0, metadata={"gt": 0.0, "description": "λ of the discriminator's loss (ELECTRA: 50)"}
    )
    lr: float | None = field(
        default=5e-5,
        metadata={
            "gt": 0.0,
            "description": "an ELECTRA model's pretraining learning rate, in place of pretrain.lr (a "
            "model's own models.<name>.pretrain.lr wins; null: pretrain.lr). Above about 5e-5 the "
            "discriminator of a small model collapses to its prior (docs/models.md)",
        },
    )


class Electra(ObjectiveSpec):
    name, kind, Params = "electra", "aligned", ElectraParams
    implementation = "models.objectives.electra"
    trains_lm_head = False  # the generator predicts tokens; the model (the discriminator) detects them

    def widths(self, seq_len: int, params: ElectraParams) -> tuple[int, int, float]:
        return seq_len, seq_len, params.mask_rate * seq_len  # the generator's expected predictions

    def has_head(self, params: ElectraParams) -> bool:
        return True


OBJECTIVE = register(Electra())
