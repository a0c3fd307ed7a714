"""The Prefect pipeline flow against `dvc repro`: the whole graph of the offline default profile.

    python bench/pipeline_flow.py [--max-parallel 2] [--target STAGE ...]

Each runner gets a fresh clone of this repository's HEAD (no outputs, an empty DVC cache and MLflow
store) and brings the graph up to date: the reference is `dvc repro` (one stage at a time, under one
repository lock), ours is `python -m flows.pipeline` (independent stages side by side). Prints one
JSON line per runner and the ratio, and checks that both leave the same dvc.lock: the flow's
bookkeeping (`dvc status` / command / `dvc commit`) must record exactly what `dvc repro` records.
`--target` brings only those stages (and what they depend on) up to date, in both runners.
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        repo = Path(tmp) / "project"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "DVC_NO_ANALYTICS": "1",
            "PYTHONPATH": str(repo),
        }
        env.pop("MLFLOW_TRACKING_URI", None)  # the project's default: mlflow.db in the clone
        (repo / "dvc.lock").unlink(missing_ok=True)  # nothing recorded: every stage runs
        started = time.perf_counter()
        result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
        return seconds, yaml.safe_load((repo / "dvc.lock").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-parallel", type=int, default=2)
    parser.add_argument("--target", action="append", default=[], help="a stage or group; repeatable")
    args = parser.parse_args()
    flow = [sys.executable, "-m", "flows.pipeline", "--max-parallel", str(args.max_parallel)]
    runners = {
        "dvc repro": [sys.executable, "-m", "dvc", "repro", *args.target],
        "flows.pipeline": flow + [f"--target={target}" for target in args.target],
    }
    seconds, locks = {}, {}
    for name, command in runners.items():
        seconds[name], locks[name] = run(command)
        print(json.dumps({"runner": name, "seconds": round(seconds[name], 1)}), flush=True)
    same = locks["dvc repro"]["stages"] == locks["flows.pipeline"]["stages"]
    print(
        json.dumps(
            {
                "stages": len(locks["dvc repro"]["stages"]),
                "speedup": round(seconds["dvc repro"] / seconds["flows.pipeline"], 2),
                "same_dvc_lock": same,
            }
        )
    )
    if not same:
        ours, reference = locks["flows.pipeline"]["stages"], locks["dvc repro"]["stages"]
        differing = {
            stage: [
                entry["path"]
                for kind in ("deps", "outs")
                for entry in reference[stage].get(kind, [])
                if entry not in ours.get(stage, {}).get(kind, [])
            ]
            for stage in reference
            if reference[stage] != ours.get(stage)
        }
        sys.exit(f"dvc.lock differs: {differing}")


if __name__ == "__main__":
    main()
