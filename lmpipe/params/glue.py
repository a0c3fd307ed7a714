"""The `glue` section: where the GLUE tasks come from, and which of them the pipeline runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from lmpipe.glue.tasks import TASKS
from lmpipe.params.schema import InputPath, Strict


class GlueParams(Strict):
    """Where GLUE comes from: a folder in the original TSV layout, or one of `save_to_disk` folders
    (one per task, e.g. written by `hub` stages from nyu-mll/glue). DVC hashes the folder."""

    source: Literal["tsv", "disk"] = "tsv"
    path: InputPath = Field(description="tsv: the GLUE folder; disk: a folder of <task>/ datasets")
    tasks: list[str] = Field(["cola", "stsb", "mrpc"], min_length=1)
    synthetic: bool = False

    @field_validator("tasks")
    @classmethod
    def _known(cls, tasks: list[str]) -> list[str]:
        for i, name in enumerate(tasks):
            if name not in TASKS:
                raise ValueError(f"item {i}, '{name}', is not a GLUE task; the tasks are: {', '.join(TASKS)}")
        return tasks
