"""Mixtures of objectives in one run: each micro-batch made by one component, drawn by weight from
that batch's own seeded stream (a resumed run draws the same), as UniLM trains one model with
bidirectional, left-to-right and sequence-to-sequence masks, and UL2 with a mixture of denoisers.
A component is a registered objective with its own params (not params.yaml's section of it, so that
two components may be one objective with other values); rows are read at the longest component's
length and cut to each one's."""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

from models.specs.objectives.base import OBJECTIVES, ObjectiveParams, ObjectiveSpec, register

# UniLM's three masks (its right-to-left LM left out): a bidirectional masked LM, a left-to-right LM and
# a sequence-to-sequence LM, in equal shares
UNILM = {
    "bidirectional": {"objective": "mlm", "weight": 1.0},
    "left_to_right": {"objective": "clm", "weight": 1.0},
    "seq2seq": {"objective": "lm", "weight": 1.0},
}
# UL2's mixture of denoisers: regular spans (R: 3 and 8 tokens at 15 %), extreme ones (X: 3 and 8 at 50 %,
# 64 at 15 and 50 %) and the sequential prefix LM (S: a quarter of the row to predict), in equal shares
# here; UL2's mode tokens ([R], [X], [S] before the inputs) are left out
UL2 = {
    "r_3": {"objective": "span", "args": {"noise_density": 0.15, "mean_span_length": 3.0}},
    "r_8": {"objective": "span", "args": {"noise_density": 0.15, "mean_span_length": 8.0}},
    "x_3": {"objective": "span", "args": {"noise_density": 0.5, "mean_span_length": 3.0}},
    "x_8": {"objective": "span", "args": {"noise_density": 0.5, "mean_span_length": 8.0}},
    "x_64": {"objective": "span", "args": {"noise_density": 0.15, "mean_span_length": 64.0}},
    "x_64_50": {"objective": "span", "args": {"noise_density": 0.5, "mean_span_length": 64.0}},
    "s": {"objective": "lm", "args": {"noise_density": 0.25}},
}


def resolved(
    components: dict[str, dict[str, Any]],
) -> list[tuple[str, float, ObjectiveSpec, ObjectiveParams]]:
    """(name, weight, objective, its params) of each component; a ValueError names a bad one."""
    if not components:
        raise ValueError("components: give at least one")
    found = []
    for name, spec in components.items():
        where = f"components.{name}"
        if not isinstance(spec, dict) or set(spec) - {"objective", "weight", "args"}:
            raise ValueError(f"{where}: give {{objective: <name>, weight: <share>, args: {{...}}}}")
        objective = OBJECTIVES.get(spec.get("objective"))
        if objective is None or objective.kind is None:
            known = ", ".join(other for other, o in OBJECTIVES.items() if o.kind is not None)
            raise ValueError(f"{where}.objective: {spec.get('objective')!r} is not one (one of: {known})")
        weight = spec.get("weight", 1.0)
        if not isinstance(weight, int | float) or weight <= 0:
            raise ValueError(f"{where}.weight: must be a number > 0, got {weight!r}")
        try:
            params = objective.Params(**spec.get("args", {}))
        except TypeError as exc:
            raise ValueError(f"{where}.args: {exc}") from None
        try:
            params.check()  # its bounds: the params schema checks them (lmpipe/params/pretrain.py)
        except ValueError as exc:
            raise ValueError(f"{where}.args: {exc}") from None
        if objective.has_head(params):  # PretrainModule builds the model's objective's head only
            raise ValueError(
                f"{where}: {objective.name} trains a head of its own (a generator, a decoder, the boundary "
                "objective), which a mixture's component cannot: train it as a model's objective"
            )
        found.append((name, float(weight), objective, params))
    return found


COMPONENTS = {"description": "name: {objective, weight (its share, default 1), args (its params)}"}


@dataclass(frozen=True)
class UniLMParams(ObjectiveParams):
    components: dict[str, dict[str, Any]] = field(
        default_factory=lambda: deepcopy(UNILM), metadata=COMPONENTS
    )

    def check(self) -> None:
        resolved(self.components)


@dataclass(frozen=True)
class UL2Params(UniLMParams):
    components: dict[str, dict[str, Any]] = field(default_factory=lambda: deepcopy(UL2), metadata=COMPONENTS)


class Mixture(ObjectiveSpec):
    """A mixture: its components make the batches (models/pretraining.py: make_batch draws one per
    micro-batch), its FLOPs are theirs by share (models/flops.py)."""

    kind, implementation = None, None

    def __init__(self, name: str, params: type[ObjectiveParams]) -> None:
        self.name, self.Params = name, params

    def components(self, params: UniLMParams) -> list[tuple[float, ObjectiveSpec, ObjectiveParams]]:
        found = resolved(params.components)
        total = sum(weight for _, weight, _, _ in found)
        return [(weight / total, objective, own) for _, weight, objective, own in found]

    def row_length(self, seq_len: int, params: UniLMParams) -> int:
        return max(objective.row_length(seq_len, own) for _, objective, own in self.components(params))

    def widths(self, seq_len: int, params: UniLMParams) -> tuple[int, int, float]:
        raise NotImplementedError("a mixture's widths are its components' (models/flops.py)")


register(Mixture("unilm", UniLMParams))
register(Mixture("ul2", UL2Params))
