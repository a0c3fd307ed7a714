"""Pretrained − scratch of one model on a subset of its GLUE evaluations: each one's Δ and their
average, with the evaluate stage's 95 % paired-bootstrap interval, verdict and detectable effect
(`lmpipe.report`), from a run's aligned predictions. The default subset is the research log's "small
tasks' average": CoLA, STS-B, MRPC and RTE, the tasks other than SST-2.

    python -m docs.results.task_average RUN --model decoder_clm [--tasks cola,stsb,mrpc,rte] [--repo .]

(from the project's root, with its venv: `-m` puts the root on the path for `lmpipe` and `models`).

RUN is a DVC experiment of the project at --repo (a sweep point's or a profile's, `--temp` ones
too), read from the DVC cache through its commit, or a `data/evaluate/predictions.parquet`.
The bootstrap's seed is the run's params.yaml `seed` (the workspace's for a file), as in `evaluate`.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import dvc.api
import pandas as pd
import yaml
from dvc.exceptions import DvcException
from dvc.scm import RevError
from dvc_data.index.index import DataIndexError

from lmpipe.layout import PREDICTIONS
from lmpipe.params.schema import PARAMS_FILE, read_params_yaml
from lmpipe.report.glue import read_aligned
from lmpipe.report.significance import compare
from lmpipe.runtime import StageError

SMALL_TASKS = "cola,stsb,mrpc,rte"


class Refused(Exception):
    """One line for the user."""


def read_run(repo: Path, run: str) -> tuple[pd.DataFrame, int]:
    """The run's aligned predictions and its params' seed; DVC resolves an experiment's name."""
    try:
        if Path(run).is_file():
            return pd.read_parquet(run), int(read_params_yaml(repo / PARAMS_FILE)["seed"])
        frame = pd.read_parquet(
            io.BytesIO(dvc.api.read(str(PREDICTIONS), repo=str(repo), rev=run, mode="rb"))
        )
        return frame, int(yaml.safe_load(dvc.api.read(str(PARAMS_FILE), repo=str(repo), rev=run))["seed"])
    except RevError:
        raise Refused(
            f"{run}: neither a predictions file nor a DVC experiment of {repo} (dvc exp list -A)"
        ) from None
    except (OSError, ValueError, DvcException, StageError) as exc:  # a missing or unreadable file
        raise Refused(f"{run}: {exc}") from None
    except DataIndexError:
        raise Refused(f"{run}: its outputs are not in the DVC cache of {repo} (dvc exp pull)") from None


def task_average(frame: pd.DataFrame, model: str, tasks: list[str], seed: int) -> list[str]:
    """A line per evaluation of `tasks` and one for their average."""
    runs, labels, _ = read_aligned(frame)
    trained = sorted({name for name, _ in runs})
    if (model, "pretrained") not in runs or (model, "scratch") not in runs:
        raise Refused(
            f"--model {model}: the run has no pretrained and scratch fine-tunes of it (it has {trained})"
        )
    chosen = [key for key in labels if key.partition("-")[0] in tasks]
    missing = [task for task in tasks if not any(key.partition("-")[0] == task for key in labels)]
    if missing:
        raise Refused(f"--tasks: the run has no {', '.join(missing)} (it has {', '.join(sorted(labels))})")
    found = compare(
        {key: runs[(model, "pretrained")][key] for key in chosen},
        {key: runs[(model, "scratch")][key] for key in chosen},
        {key: labels[key] for key in chosen},
        seed,
    )
    return [
        f"{key:8s} {d.delta:+6.2f} [{d.low:+.2f}, {d.high:+.2f}] {d.verdict}, detectable {d.detectable:.1f}"
        for key, d in found.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a DVC experiment's name or a predictions.parquet")
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", default=SMALL_TASKS, help=f"comma-separated (default {SMALL_TASKS})")
    parser.add_argument("--repo", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    try:
        frame, seed = read_run(args.repo.resolve(), args.run)
        lines = task_average(frame, args.model, args.tasks.split(","), seed)
    except Refused as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
