"""Stage `pretrain@<model>`: train one named model variant of `params.yaml: models` with its objective.

Reads `data/tokens`, writes `checkpoints/<model>/final/{config.json, model.safetensors}` (later stages
load only these), `metrics/pretrain/<model>.json` and the loss curve `plots/pretrain/<model>.csv`.
Lightning checkpoints in `checkpoints/<model>/resume/<fingerprint>` let a re-run after an interruption
continue where it stopped, as long as nothing that shapes the run has changed: beside the DVC outputs,
not one of them, so DVC never deletes them, and in the project's root even when the stage runs in a
temporary experiment (a sweep point, a profile). They are deleted once the run has finished.
"""

from __future__ import annotations

import argparse

from lmpipe.params.pretrain import PretrainSections
from lmpipe.params.project import load_stage_params
from lmpipe.pretraining import pretrain
from lmpipe.runtime import StageError, run_main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.pretrain")
    parser.add_argument("model", help="a key of params.yaml: models")
    name = parser.parse_args(argv).model
    params = load_stage_params(PretrainSections)
    params.check_model(name)
    if params.student(name) is not None:
        raise StageError(f"params.yaml: distill.students.{name}: a student; stage distill@{name} trains it")
    pretrain(name, params)


if __name__ == "__main__":
    run_main(main)
