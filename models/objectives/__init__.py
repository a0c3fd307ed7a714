"""The pretraining objectives, one module each (the pair it makes of rows, its params with their
bounds, its widths for the FLOPs count), registered here once: a new objective is one module and one
line below (or a call of `register` from a module of its own); params.yaml's `objectives` section is
derived from this registry (lmpipe/params/pretrain.py)."""

from __future__ import annotations

from models.objectives import bart, bert_style, clm, deshuffle, drop, electra, lm, mae_lm, mixture, mlm, span
from models.objectives.base import Objective

OBJECTIVES: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
    """Add an objective to the registry: `models.<name>.objective` may name it, `objectives.<name>`
    holds its params."""
    OBJECTIVES[objective.name] = objective
    return objective


for _module in (mlm, clm, lm, span, bert_style, drop, deshuffle, bart, electra, mae_lm):
    register(_module.OBJECTIVE)
register(mixture.Mixture("unilm", mixture.UniLMParams))
register(mixture.Mixture("ul2", mixture.UL2Params))
