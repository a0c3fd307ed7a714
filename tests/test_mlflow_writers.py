"""Several sweep points write to the embedded MLflow store at once: every run, param and metric lands."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import mlflow
import psutil
import pytest

from lmpipe import run_writer
from lmpipe.tracking import PARENT_RUN_ENV, stage_run
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


SHORT = """
from lmpipe.tracking import stage_run

with stage_run("short", "writers", {"point": 1}) as run:
    run.log_metrics({"loss": 0.5})
"""

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
    """The writer sees the stage's connection close without the run's end, and ends the run rather than
    leaving it RUNNING for ever."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    env.pop(PARENT_RUN_ENV, None)
    out = subprocess.run(
        [sys.executable, "-c", KILLED], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    client = mlflow.MlflowClient(uri)
    deadline = time.monotonic() + 120
    while (
        run := client.get_run(out.stdout.strip())
    ).info.status == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
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


def test_an_idle_writer_gives_up_its_socket_and_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_writer, "IDLE_SECONDS", 0.5)
    path = tmp_path / "runs.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    writer = threading.Thread(target=run_writer.serve, args=(listener.detach(), path), daemon=True)
    writer.start()
    writer.join(timeout=60)
    assert not writer.is_alive() and not path.exists()


def test_a_dead_writers_socket_is_replaced_by_a_new_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer killed with its socket left behind: the next stage starts another one there."""
    folder = Path(tempfile.mkdtemp(prefix="writer-", dir="/tmp"))  # (a socket's path is short)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(run_writer.socket_path()))
    stale.close()  # bound, never listened on: a connection is refused, as to a dead writer's
    connection = run_writer.Connection()
    connection.send(
        "start",
        cwd=str(folder),
        uri=f"sqlite:///{folder}/mlflow.db",
        experiment="writers",
        execution={"key": "k", "workspace": "w", "commit": "c"},
        tags={"stage": "probe"},
        run_name="probe",
        started_at=time.time(),
        source="probe.py",
        params={},
    )
    assert connection.reply()["run_id"]
    connection.send("end", status="FINISHED", seconds=1.0)
    assert connection.reply() == {}
    client = mlflow.MlflowClient(f"sqlite:///{folder}/mlflow.db")
    runs = client.search_runs(
        [client.get_experiment_by_name("writers").experiment_id], "tags.stage = 'probe'"
    )
    assert [run.info.status for run in runs] == ["FINISHED"]


def test_the_stages_of_a_pipeline_share_one_writer(tmp_path: Path) -> None:
    """The second stage finds the first one's writer still there (while a run is open, its only one)."""
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONPATH": str(ROOT),
    }
    for _ in range(2):
        subprocess.run([sys.executable, "-c", SHORT], env=env, cwd=tmp_path, check=True, timeout=300)
    with stage_run("third", "writers", {}):
        listening = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(run_writer.socket_path()) in (p.info["cmdline"] or [])
        ]
    assert len(listening) == 1
