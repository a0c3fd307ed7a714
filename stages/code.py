"""Stage `code`: each model's own code, for DVC. Writes `code.yaml`: for every stage over `models` (its
arguments: dvc.yaml's `foreach: ${models}` stages), for every registered objective and architecture,
a digest (sha256, its first 16 hex digits) of the files that unit adds to the stage's own code
(lmpipe/codedeps.py). Those stages list their model's two keys under `params:`, so that an edit to one
objective's or architecture's modules re-runs only the models that use it, and their own deps name
only the code every model runs. Its MLflow run logs the digests as params: which objective's or
architecture's code changed between two runs.
"""

from __future__ import annotations

import argparse

import yaml

from lmpipe.codedeps import digests
from lmpipe.layout import CODE_DIGESTS
from lmpipe.runtime import atomic_file, run_main
from lmpipe.tracking import stage_run, tracking_experiment

# the registries and loaders this stage hashes every unit of (lmpipe/codedeps.py: its code deps)
READS_SOURCE_OF = (
    "models.specs.objectives",
    "models.specs.architectures",
    "models.implementations",
    "models.architectures.base",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.code")
    parser.add_argument("stages", nargs="+", help="dvc.yaml's stages over `models`")
    stages = parser.parse_args(argv).stages
    found = digests(stages)
    with stage_run("code", tracking_experiment(), {"code": found}), atomic_file(CODE_DIGESTS) as out:
        out.write("# written by `python -m stages.code` (dvc.yaml's stage `code`): see stages/code.py\n")
        yaml.safe_dump(found, out, sort_keys=False)


if __name__ == "__main__":
    run_main(main)
