"""`python -m lmpipe.regenerate`: what the project derives from its code and registries is in its files,
and a newly registered objective gets its params.yaml section from its declaration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from lmpipe.regenerate import PARAMS, params_with_every_objective, stale
from models.specs.objectives import OBJECTIVES, register
from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec


def test_the_derived_files_are_as_the_code_says() -> None:
    assert stale() == [], "run python -m lmpipe.regenerate"


@dataclass(frozen=True)
class ToyParams(ObjectiveParams):
    keep: int = field(default=4, metadata={"ge": 1})
    order: str = "reversed"


class Toy(ObjectiveSpec):
    name, kind, Params, implementation = "toy", "sequence", ToyParams, "toy_plugin"

    def widths(self, seq_len: int, args: dict) -> tuple[int, int, float]:
        return seq_len, args["keep"], args["keep"]


@pytest.fixture
def toy() -> Iterator[None]:
    register(Toy())
    yield
    del OBJECTIVES["toy"]


def test_a_registered_objective_gets_its_section_and_nothing_else_changes(toy: None) -> None:
    before = PARAMS.read_text(encoding="utf-8")
    after = params_with_every_objective(before)
    added = [line for line in after.splitlines() if line not in before.splitlines()]
    assert added == ["  toy: {keep: 4, order: reversed}"]
    assert after.replace(added[0] + "\n", "") == before
    parsed = yaml.safe_load(after)
    assert parsed["objectives"]["toy"] == {"keep": 4, "order": "reversed"}
    assert list(parsed["objectives"])[-1] == "toy" and list(parsed)[:6] == list(yaml.safe_load(before))[:6]
    assert params_with_every_objective(after) == after
