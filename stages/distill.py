"""Stage `distill@<student>`: train a student of `params.yaml: distill.students` from its teacher, a
pretrained model of `models`, with DistilBERT's loss (models/distillation.py).

Reads `data/tokens` and the teacher's `checkpoints/<teacher>/final`; writes what `pretrain@` writes for a
model (`checkpoints/<student>/final`, `metrics/pretrain/<student>.json`, `plots/pretrain/<student>.csv`),
so that the student fine-tunes, exports and is evaluated as any model is. An interrupted run resumes as
a pretraining does (lmpipe/pretraining.py), the teacher's weights part of what it must match.
"""

from __future__ import annotations

import argparse
from functools import partial

from lmpipe.distillation import student_run
from lmpipe.params.pretrain import PretrainSections
from lmpipe.params.project import load_stage_params
from lmpipe.pretraining import pretrain
from lmpipe.runtime import StageError, run_main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.distill")
    parser.add_argument("student", help="a key of params.yaml: distill.students")
    name = parser.parse_args(argv).student
    params = load_stage_params(PretrainSections)
    student = params.student(name)
    if student is None:
        known = ", ".join(params.distill.students) or "(none)"
        raise StageError(f"params.yaml: distill.students.{name}: no such student; the students are: {known}")
    pretrain(name, params, partial(student_run, student))


if __name__ == "__main__":
    run_main(main)
