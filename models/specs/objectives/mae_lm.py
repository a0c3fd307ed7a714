"""MAE-LM, declared: its params and their bounds, the tokens a row reads and the widths of its pair
(models/objectives/mae_lm.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


@dataclass(frozen=True)
class MaeLmParams(ObjectiveParams):
    mask_rate: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    decoder_layers: int = field(
        default=4,
        metadata={"ge": 1, "description": "the decoder's layers, at the encoder's width (MAE-LM: 4)"},
    )


class MaeLm(ObjectiveSpec):
    name, kind, Params = "mae_lm", "aligned", MaeLmParams
    implementation = "models.objectives.mae_lm"
    trains_lm_head = False  # the decoder's states feed the LM head, never the encoder's

    def widths(self, seq_len: int, params: MaeLmParams) -> tuple[int, int, float]:
        return seq_len, seq_len, params.mask_rate * seq_len

    def has_head(self, params: MaeLmParams) -> bool:
        return True


OBJECTIVE = register(MaeLm())
