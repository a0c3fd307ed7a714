"""Several sweep points write to the embedded MLflow store at once: every run, param and metric lands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import mlflow

from lmpipe.tracking import PARENT_RUN_ENV
from tests.workdir import ROOT

WRITER = """
import sys
from lmpipe.tracking import stage_run

index = int(sys.argv[1])
params = {"point": index, "objectives": {"mlm": {"mask_rate": 0.1 * index}}}
with stage_run("writer", "writers", params, {"writer": index}) as run:
    for step in range(100):  # one request per metric, as Lightning's logger makes them
        run.log_metrics({"loss": 1.0 / (step + 1), "step_seen": step})
    run.log_series("curve", [float(i) for i in range(500)])
"""


def test_four_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("writers")  # as a sweep does: the store exists first
    sweep = client.create_run(experiment_id, tags={"stage": "ablation"}).info.run_id  # and its parent run
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT), PARENT_RUN_ENV: sweep}
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(i)], env=env, stderr=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    for writer in writers:
        assert writer.wait(timeout=300) == 0, writer.stderr.read()

    runs = [run for run in client.search_runs([experiment_id]) if run.info.run_id != sweep]
    assert sorted(int(run.data.tags["writer"]) for run in runs) == [0, 1, 2, 3]
    for run in runs:
        index = int(run.data.tags["writer"])
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == sweep
        assert run.data.params["objectives.mlm.mask_rate"] == str(0.1 * index)
        for key, count in [("loss", 100), ("step_seen", 100), ("curve", 500)]:
            assert len(client.get_metric_history(run.info.run_id, key)) == count
        assert sorted(m.value for m in client.get_metric_history(run.info.run_id, "step_seen")) == list(
            map(float, range(100))
        )


KILLED = """
import os
import signal
from lmpipe.tracking import stage_run

with stage_run("killed", "writers", {"point": 1}) as run:
    run.log_metrics({"loss": 0.5})
    print(run.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""

FAILING = """
from lmpipe.runtime import run_main
from lmpipe.tracking import stage_run


def main():
    with stage_run("failing", "writers", {"point": 1}) as run:
        run.log_metrics({"loss": 0.5})


run_main(main)
"""


def test_a_stage_killed_leaves_its_run_killed_with_what_it_logged(tmp_path: Path) -> None:
    """The helper process that writes the run sees the stage go and ends the run, rather than leaving it
    RUNNING for ever."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    env.pop(PARENT_RUN_ENV, None)
    out = subprocess.run(
        [sys.executable, "-c", KILLED], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    run = mlflow.MlflowClient(uri).get_run(out.stdout.strip())  # the helper has ended: its stderr closed
    assert run.info.status == "KILLED" and run.data.metrics == {"loss": 0.5}
    assert run.data.tags["stage"] == "killed" and run.data.params == {"point": "1"}


def test_a_store_that_cannot_be_written_fails_the_stage_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "store").write_text("not a folder")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'store/mlflow.db'}"}
    env |= {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", FAILING], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith(f"error: MLflow (sqlite:///{tmp_path}/store/mlflow.db): ")
    assert "Traceback" not in out.stderr
