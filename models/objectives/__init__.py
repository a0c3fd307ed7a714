"""The pretraining objectives, one module each (what a batch is, which logits its loss compares, its
shapes for the FLOPs count), registered here once: a new objective is one module and one line below,
and its section of params.yaml `objectives` (lmpipe/params/pretrain.py)."""

from models.objectives import clm, mlm, span
from models.objectives.base import Objective

OBJECTIVES: dict[str, Objective] = {o.name: o for o in (mlm.OBJECTIVE, clm.OBJECTIVE, span.OBJECTIVE)}
