"""Where a declaration's implementation is loaded: the training, fine-tuning and export code asks
here, by the module its declaration names (models/specs), so that params validation never imports
torch. lmpipe/codedeps.py counts every registered implementation as code of a module that imports
this one."""

from __future__ import annotations

from functools import cache
from importlib import import_module

from models.objectives.base import ObjectiveImplementation
from models.specs.objectives import OBJECTIVES, ObjectiveSpec


@cache
def objective(name: str) -> ObjectiveImplementation:
    """The implementation of the registered objective `name` (not a mixture: its parts make its pairs)."""
    spec: ObjectiveSpec = OBJECTIVES[name]
    if spec.implementation is None:
        raise ValueError(f"objective {name} is a mixture: its components' implementations make its pairs")
    return import_module(spec.implementation).IMPLEMENTATION
