"""MAE-LM (Meng et al., 2024, "Representation Deficiency in Masked Language Modeling"): the encoder never
sees [MASK]. The selected tokens (15 %) are held out of the encoder's attention, as padding is, so the
unmasked tokens are encoded from one another alone, each at its own position; a small bidirectional
decoder (`decoder_layers`, the encoder's width; discarded after pretraining) reads the encoder's
states with [MASK] embeddings (and their positions) in the held-out places and predicts those tokens
through the tied LM head. Only the encoder fine-tunes and exports. The held-out tokens are masked
out of the attention, not gathered away: the encoder computes the row's full length (the FLOPs count
says so), where MAE-LM's gathers the 85 % it reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.specs.objectives.base import Args, ObjectiveParams, ObjectiveSpec, register


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

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        return seq_len, seq_len, args["mask_rate"] * seq_len

    def has_head(self, args: Args) -> bool:
        return True


OBJECTIVE = register(MaeLm())
