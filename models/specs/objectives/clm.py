"""GPT's causal LM, declared: its params and their bounds, the tokens a row reads and the widths of its pair
(models/objectives/clm.py says what it computes and how)."""

from __future__ import annotations

from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec, register


class CausalLM(ObjectiveSpec):
    name, kind = "clm", "targets_only"
    implementation = "models.objectives.clm"

    def row_length(self, seq_len: int, params: ObjectiveParams) -> int:
        return seq_len + 1  # a decoder reads seq_len of them and predicts each one's next

    def widths(self, seq_len: int, params: ObjectiveParams) -> tuple[int, int, float]:
        return 0, seq_len + 1, seq_len


OBJECTIVE = register(CausalLM())
