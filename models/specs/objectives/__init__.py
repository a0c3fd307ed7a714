"""The objectives' declarations (what params.yaml's `objectives.<name>` holds and what the params
check needs, models/specs/objectives/base.py), each registered as its module is imported here: a new
objective is its declaration, its implementation (models/objectives/) and one line below; params.yaml's
`objectives` section is derived from this registry (lmpipe/params/pretrain.py)."""

from __future__ import annotations

from models.specs.objectives.base import OBJECTIVES as OBJECTIVES
from models.specs.objectives.base import ObjectiveParams as ObjectiveParams
from models.specs.objectives.base import ObjectiveSpec as ObjectiveSpec
from models.specs.objectives.base import register as register

# the registry's order is the docs' and the params' order
# isort: off
from models.specs.objectives import mlm as mlm
from models.specs.objectives import clm as clm
from models.specs.objectives import lm as lm
from models.specs.objectives import span as span
from models.specs.objectives import bert_style as bert_style
from models.specs.objectives import drop as drop
from models.specs.objectives import deshuffle as deshuffle
from models.specs.objectives import bart as bart
from models.specs.objectives import electra as electra
from models.specs.objectives import mae_lm as mae_lm
from models.specs.objectives import mtp as mtp
from models.specs.objectives import plm as plm
from models.specs.objectives import cbow as cbow
from models.specs.objectives import mixture as mixture  # unilm, ul2
# isort: on
