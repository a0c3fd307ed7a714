"""Multi-token prediction, declared: its params and their bounds, the tokens a row reads and the widths of
its pair (models/objectives/mtp.py says what it computes and how)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register

# DeepSeek-V3's λ over the first 10 T tokens (0.1 after): the MTP losses' weight, shared by its depths
DEEPSEEK_LAMBDA = 0.3


@dataclass(frozen=True)
class MTPParams(ObjectiveParams):
    depth: int = field(
        default=1,
        metadata={
            "ge": 1,
            "description": "the tokens predicted beyond the next one at every position (DeepSeek-V3's D: "
            "1; Gloeckle et al.'s n is depth + 1)",
        },
    )
    form: Literal["parallel", "sequential"] = field(
        default="parallel",
        metadata={
            "description": "parallel: Gloeckle et al.'s heads on a shared trunk, each one block, the model's "
            "last block the next token's head; sequential: DeepSeek-V3's modules, each the previous "
            "depth's states and the next token's embedding through a projection and one block, keeping "
            "the causal chain"
        },
    )
    weight: float | None = field(
        default=None,
        metadata={
            "gt": 0.0,
            "description": "each deeper prediction's loss weight beside the next token's (null: the form's "
            "paper's: parallel 1, Gloeckle et al.'s plain sum; sequential λ/D with DeepSeek-V3's λ 0.3)",
        },
    )

    def depth_weight(self) -> float:
        """The weight of each deeper prediction's loss in the step's sum."""
        if self.weight is not None:
            return self.weight
        return 1.0 if self.form == "parallel" else DEEPSEEK_LAMBDA / self.depth


class MultiTokenPrediction(ObjectiveSpec):
    name, kind, Params = "mtp", "targets_only", MTPParams
    implementation = "models.objectives.mtp"

    def row_length(self, seq_len: int, params: MTPParams) -> int:
        return seq_len + 1 + params.depth  # the tokens after the row's last input: its deepest labels

    def widths(self, seq_len: int, params: MTPParams) -> tuple[int, int, float]:
        # the causal LM's pair: its deeper labels ride beside it (the pair's `extras`)
        return 0, seq_len + 1, seq_len

    def has_head(self, params: MTPParams) -> bool:
        return True

    def model_needs(self, params: MTPParams) -> dict[str, Any]:
        return {"arch": ("decoder", "prefix_lm")}  # its heads run a transformer decoder's blocks


OBJECTIVE = register(MultiTokenPrediction())
