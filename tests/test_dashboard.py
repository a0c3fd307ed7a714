"""The MLflow dashboard as a user opens it: a reproduced pipeline's store behind a real `mlflow server`,
read in headless Chromium at the page `make ui` prints. Skips without Chromium (`.ci/run` installs
Debian's)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import mlflow
import pytest

from tests.project import command_env, copy_project
from tests.services import BIN, free_port, start, stop, wait_until_up

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# as the machine notes say: no first-run work, no background connections on a closed network
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def rendered(url: str, profile: Path, screenshot: Path | None = None) -> str:
    """The page's DOM after its scripts ran (and a screenshot, when asked)."""
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1600,1000"]
    args += ["--virtual-time-budget=20000"]
    if screenshot is not None:
        subprocess.run(
            [*args, f"--screenshot={screenshot}", url], capture_output=True, timeout=180, check=True
        )
    result = subprocess.run(
        [*args, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True
    )
    return re.sub(r"<[^>]+>", " ", result.stdout)


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (.ci/run installs Debian's chromium)")
def test_mlflow_opens_on_the_pipelines_runs_with_glue_on_the_model(
    reproduced_template: Path, tmp_path: Path
) -> None:
    from lmpipe.tracking import ui_link

    project = copy_project(reproduced_template, tmp_path / "project")  # `dvc repro` into its mlflow.db
    store = f"sqlite:///{project / 'mlflow.db'}"
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("lmpipe")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [run for run in runs if run.data.tags["stage"] == "pipeline"]
    (pretrain,) = [run for run in runs if run.data.tags["stage"] == "pretrain"]
    assert all(run.data.tags.get("mlflow.parentRunId") == parent.info.run_id for run in runs if run != parent)
    assert "glue.average" in pretrain.data.metrics and "glue.delta.average" in pretrain.data.metrics

    port = free_port()
    log = tmp_path / "mlflow.log"
    server = start(
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            store,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        log,
        command_env(),
        cwd=project,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", server, log)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("MLFLOW_TRACKING_URI", store)
            link = ui_link("lmpipe", port)
        assert (
            link
            == f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}?workflowType=machine_learning"
        )
        page = rendered(link, tmp_path / "chromium", tmp_path / "runs.png")
        # the training runs, not MLflow 3's GenAI overview; one row for the execution, stages under it
        assert "Runs" in page and "Model training" in page
        assert "Detect Issues" not in page and "Token Usage" not in page
        assert parent.info.run_name in page
        assert (tmp_path / "runs.png").stat().st_size > 10_000
        # the model's run shows its GLUE scores
        run_page = rendered(
            f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs/{pretrain.info.run_id}"
            "?workflowType=machine_learning",
            tmp_path / "chromium",
        )
        assert "glue.average" in run_page and "glue.delta.average" in run_page
    finally:
        stop(server)
