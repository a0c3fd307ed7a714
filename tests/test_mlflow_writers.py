"""Several sweep points write to the embedded MLflow store at once: every run, param and metric lands."""

from __future__ import annotations

import os
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
