"""MLflow conventions: one run per stage execution, with params, counts, duration and tags.

The store is `sqlite:///mlflow.db` in the repo unless `MLFLOW_TRACKING_URI` says otherwise; a
pipeline or sweep that wants its stage runs grouped sets `LMPIPE_PARENT_RUN_ID`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
PARENT_RUN_ENV = "LMPIPE_PARENT_RUN_ID"
_MLFLOW_BATCH = 100  # MLflow's per-request cap on params
_MLFLOW_METRIC_BATCH = 1000  # and on metrics


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: params and metrics by dotted key, as in params.yaml."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class StageRun:
    """The handle a stage logs through while its MLflow run is open."""

    def __init__(self, mlflow_module: Any, run_id: str) -> None:
        self._mlflow = mlflow_module
        self.run_id = run_id

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        numeric = {
            k: float(v)
            for k, v in flatten(metrics).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if numeric:
            self._mlflow.log_metrics(numeric)

    def log_series(self, key: str, values: Sequence[float], first_step: int = 0) -> None:
        """A curve (one value per step) in one request rather than one per point."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(v), now, first_step + i) for i, v in enumerate(values)]
        client = self._mlflow.MlflowClient()
        for i in range(0, len(metrics), _MLFLOW_METRIC_BATCH):
            client.log_batch(self.run_id, metrics=metrics[i : i + _MLFLOW_METRIC_BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str) -> None:
        self._mlflow.log_artifact(path)


@contextmanager
def stage_run(
    stage: str,
    experiment: str,
    params: Mapping[str, Any],
    tags: Mapping[str, Any] | None = None,
    run_name: str | None = None,
) -> Iterator[StageRun]:
    import mlflow  # slow to import; only stages that run pay for it

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
    mlflow.set_experiment(experiment)
    run_tags = {"stage": stage, "git_commit": git_commit(), **(tags or {})}
    if os.environ.get("DVC_EXP_NAME"):
        run_tags["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    if os.environ.get(PARENT_RUN_ENV):
        run_tags["mlflow.parentRunId"] = os.environ[PARENT_RUN_ENV]
    with mlflow.start_run(run_name=run_name or stage, tags={k: str(v) for k, v in run_tags.items()}) as run:
        flat = [(k, "" if v is None else str(v)) for k, v in flatten(params).items()]
        for i in range(0, len(flat), _MLFLOW_BATCH):
            mlflow.log_params(dict(flat[i : i + _MLFLOW_BATCH]))
        started = time.perf_counter()
        yield StageRun(mlflow, run.info.run_id)
        mlflow.log_metric("duration_s", time.perf_counter() - started)


def _client() -> Any:
    import mlflow

    return mlflow.MlflowClient(os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)


def find_run(experiment: str, tags: Mapping[str, str]) -> str | None:
    """The latest run of `experiment` carrying all of `tags`, or None."""
    client = _client()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs(
        [found.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=1
    )
    return runs[0].info.run_id if runs else None


def log_to_run(run_id: str, metrics: Mapping[str, float]) -> None:
    """Metrics into an existing (finished) run."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    _client().log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
