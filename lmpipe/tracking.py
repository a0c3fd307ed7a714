"""MLflow conventions, all of them: the store, one run per stage execution with params, counts,
duration and tags, the tags that link the runs of one pipeline, and the flows' parent runs.

The store is `sqlite:///mlflow.db` in the repo unless `MLFLOW_TRACKING_URI` says otherwise. The
experiment is marked as model training, so that MLflow 3's UI opens it on its runs, not on the GenAI
overview. Every stage run has a parent that groups one pipeline execution: the flow's run when a flow
sets `LMPIPE_PARENT_RUN_ID`, else a `pipeline` run per (DVC experiment or workspace, commit,
params.yaml), found or created by the first stage that runs. A fine-tune's run is found by the digest
of the weights it loaded (`weights_sha256` on the pretrain run) and `evaluate` finds each fine-tune run
by the digest of its predictions (`predictions_sha256`).

A stage does not import MLflow (about 3 s with its store): its runs are written by a process that the
stages share (lmpipe/run_writer.py), warm after the first stage of a pipeline: see `StageRun`.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from lmpipe.layout import project_root
from lmpipe.params.schema import PARAMS_FILE, Strict, _problems, read_params_yaml
from lmpipe.run_writer import Connection, socket_path
from lmpipe.runtime import StageError, log

PARENT_RUN_ENV = "LMPIPE_PARENT_RUN_ID"
WEIGHTS_TAG = "weights_sha256"
PREDICTIONS_TAG = "predictions_sha256"
PIPELINE_TAG = "pipeline_key"
FLOW_PROCESS_TAG = "flow_process"  # a flow's parent run: the process that owns it (`flow_process`)
# MLflow 3 opens an experiment without this tag on its GenAI overview ("Traces 0"), not on its runs
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
MLFLOW_BATCH = 100  # MLflow's per-request cap on params
MLFLOW_METRIC_BATCH = 1000  # and on metrics


class TrackingParams(Strict):
    experiment: str = Field("lmpipe", min_length=1)


def tracking_experiment(path: Path = PARAMS_FILE) -> str:
    """The MLflow experiment params.yaml names, read without validating the other sections: a stage or
    a flow opens its run before anything else is checked."""
    raw = read_params_yaml(path)
    section = raw.get("tracking") if isinstance(raw, dict) else None
    try:
        return TrackingParams.model_validate(section or {}).experiment
    except ValidationError as exc:
        raise StageError(f"{path}: {_problems(exc, 'tracking')}") from None


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


def tracking_uri(repo_dir: Path | None = None) -> str:
    """`MLFLOW_TRACKING_URI`, else the SQLite store `mlflow.db` in `repo_dir` or in the project's root:
    the stages of `dvc exp run --temp` (a flow's points, a profile, `dvc queue`) run in a temporary copy
    of the workspace, which DVC deletes afterwards, and log to the workspace's store."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(repo_dir or project_root()) / 'mlflow.db'}"


def child_env(parent_run_id: str, uri: str) -> dict[str, str]:
    """What a flow puts in the environment of the stages it runs, so that their runs nest under its run."""
    return {PARENT_RUN_ENV: parent_run_id, "MLFLOW_TRACKING_URI": uri}


def experiment_id(client: Any, name: str) -> str:
    """The experiment `name` (created if missing), marked as model training. Concurrent sweep points race
    to create or mark it: a write refused because another process made it first is tried once more,
    after reading what that process wrote."""
    from mlflow.exceptions import MlflowException

    try:
        return _marked_experiment(client, name)
    except MlflowException:
        return _marked_experiment(client, name)


def _marked_experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name, tags=EXPERIMENT_KIND)
    for key, value in EXPERIMENT_KIND.items():
        if found.tags.get(key) != value:
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def pipeline_key() -> dict[str, str]:
    """What names this pipeline execution: the flow's run (`run_id`), or the digest of (DVC experiment or
    workspace, commit, params.yaml) that its `pipeline` run is tagged with."""
    if os.environ.get(PARENT_RUN_ENV):
        return {"run_id": os.environ[PARENT_RUN_ENV]}
    workspace, commit = os.environ.get("DVC_EXP_NAME", "workspace"), git_commit()
    params = PARAMS_FILE.read_bytes() if PARAMS_FILE.exists() else b""
    key = hashlib.sha256(b"\0".join([workspace.encode(), commit.encode(), params])).hexdigest()[:12]
    return {"key": key, "workspace": workspace, "commit": commit}


def pipeline_parent(client: Any, experiment: str, execution: Mapping[str, str] | None = None) -> str:
    """The parent run of this pipeline execution's stage runs (`execution`: `pipeline_key()`, read here
    unless given): the flow's, or the `pipeline` run of its key, created by the first stage that needs it."""
    execution = execution or pipeline_key()
    if "run_id" in execution:
        return execution["run_id"]
    key, workspace, commit = execution["key"], execution["workspace"], execution["commit"]
    found = client.search_runs(
        [experiment],
        tags_query({PIPELINE_TAG: key}),
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    if found:
        return found[0].info.run_id
    tags = {"stage": "pipeline", PIPELINE_TAG: key, "git_commit": commit, "dvc_experiment": workspace}
    run = client.create_run(experiment, run_name=f"{workspace} {commit[:7]} {key[:4]}", tags=tags)
    client.set_terminated(run.info.run_id)  # a folder for the stage runs: it has nothing to run
    return run.info.run_id


def run_tags(stage: str, tags: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The tags of a stage's run, but for its parent: the stage, the code's commit, the DVC experiment
    and the stage's own."""
    found = {"stage": stage, "git_commit": git_commit(), **(tags or {})}
    if os.environ.get("DVC_EXP_NAME"):
        found["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    return {k: str(v) for k, v in found.items()}


def finetune_run_key(model: str, task: str, init: str, seed: int) -> dict[str, str]:
    """The tags naming one seed's fine-tune run; `finetune` sets them and `evaluate` searches by them."""
    return {"stage": "finetune", "model": model, "task": task, "init": init, "seed": str(seed)}


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class StageRun:
    """The handle a stage logs through while its run is open. The run is written by the writer process
    (lmpipe/run_writer.py): the calls here are messages to it, and the stage waits only for what it
    needs an answer to: the run's ids, an artifact copied, the run's end."""

    def __init__(self, writer: Connection) -> None:
        self._writer = writer
        self._ids: dict[str, str] | None = None

    def _opened(self) -> dict[str, str]:
        if self._ids is None:
            self._ids = self._writer.reply()  # the answer to `start`, the first owed
        return self._ids

    @property
    def run_id(self) -> str:
        return self._opened()["run_id"]

    @property
    def parent_id(self) -> str:
        """The pipeline execution's run."""
        return self._opened()["parent_id"]

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        numeric = {
            k: float(v)
            for k, v in flatten(metrics).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if numeric:
            self._writer.send("metrics", metrics=numeric)

    def log_series(self, key: str, values: Sequence[float], first_step: int = 0) -> None:
        """A curve (one value per step) in one request rather than one per point."""
        self._writer.send("series", key=key, values=[float(v) for v in values], first_step=first_step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._writer.send("tags", tags={k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str) -> None:
        """Copied into the run's artifacts before this returns: the file may go afterwards."""
        self._opened()
        self._writer.send("artifact", path=str(Path(path).resolve()))
        self._writer.reply()

    def end(self, status: str, seconds: float | None) -> None:
        self._opened()
        self._writer.send("end", status=status, seconds=seconds)
        self._writer.reply()


_connection: Connection | None = None


def _writer() -> Connection:
    """This process's connection to the writer (`lmpipe/run_writer.py`), for all its runs."""
    global _connection
    if _connection is None or _connection.broken or _connection.path != socket_path():  # (other settings)
        _connection = Connection()
    return _connection


def _absolute(uri: str) -> str:
    """A SQLite store's URI with an absolute path: the writer serves stages in other folders."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


@contextmanager
def stage_run(
    stage: str,
    experiment: str,
    params: Mapping[str, Any],
    tags: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    started_at: float | None = None,
) -> Iterator[StageRun]:
    """A stage's MLflow run, open for the block, FAILED if it raises. `started_at` (a Unix time): the
    work was done before the block, which logs it (a fine-tune in a worker process); the run starts and
    lasts as the work did. A store that cannot be written fails the stage where it next waits for the
    writer (at the latest, the block's end)."""
    started = time.time() if started_at is None else started_at
    writer = _writer()
    writer.send(
        "start",
        cwd=os.getcwd(),
        uri=_absolute(tracking_uri()),
        experiment=experiment,
        execution=pipeline_key(),
        tags=run_tags(stage, tags),
        run_name=run_name or stage,
        started_at=started,
        source=sys.argv[0] if sys.argv else "",
        params={k: "" if v is None else str(v) for k, v in flatten(params).items()},
    )
    run = StageRun(writer)
    try:
        yield run
    except BaseException:
        try:
            run.end("FAILED", None)
        except StageError as exc:  # the stage's own error is the one to report
            log.warning("%s", exc)
        raise
    run.end("FINISHED", time.time() - started)


def _client(uri: str | None = None) -> Any:
    import mlflow

    return mlflow.MlflowClient(uri or tracking_uri())


def lightning_logger(
    experiment: str, name: str, run_file: Path, resuming: bool, tags: Mapping[str, Any], run_name: str = ""
) -> Any:
    """Lightning's MLflow logger for `pretrain@<name>` (or `run_name`: a student's `distill@<name>`, a
    pretraining run too), with the stage runs' tags; a resumed run goes on logging into the run it
    started (its id kept in `run_file`)."""
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities import rank_zero_only

    run_id = run_file.read_text().strip() if resuming and run_file.exists() else None
    client = _client()
    parent = pipeline_parent(client, experiment_id(client, experiment))
    logger = MLFlowLogger(
        experiment_name=experiment,
        run_name=run_name or f"pretrain@{name}",
        tracking_uri=tracking_uri(),
        tags=None if run_id else {**run_tags("pretrain", tags), "mlflow.parentRunId": parent},
        run_id=run_id,
    )
    if rank_zero_only.rank == 0:  # only rank 0 has a run (DDP/FSDP start one process per device)
        run_file.write_text(logger.run_id)
    return logger


def tags_query(tags: Mapping[str, str]) -> str:
    """An MLflow search filter for the runs carrying all of `tags`."""
    return " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())


def find_run(experiment: str, tags: Mapping[str, str], uri: str | None = None) -> str | None:
    """The latest run of `experiment` carrying all of `tags` in the store `uri` (the project's), or None."""
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id], tags_query(tags), order_by=["attributes.start_time DESC"], max_results=1
    )
    return runs[0].info.run_id if runs else None


def log_to_run(run_id: str, metrics: Mapping[str, float]) -> None:
    """Metrics into an existing (finished) run."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    _client().log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])


def ui_link(experiment: str, port: int) -> str:
    """The page of `mlflow ui` that shows the experiment's runs: in MLflow 3's model-training view,
    which the UI otherwise opens only after the user switches from its GenAI default."""
    found = _client().get_experiment_by_name(experiment)
    page = f"experiments/{found.experiment_id}" if found else "experiments"
    return f"http://127.0.0.1:{port}/#/{page}?workflowType=machine_learning"


def close_pipeline_run(run_id: str) -> None:
    """The execution ends with evaluate: a `pipeline` run's end time becomes now, so that the UI shows
    the execution's duration (a flow's own parent run is the flow's business)."""
    client = _client()
    if client.get_run(run_id).data.tags.get("stage") == "pipeline":
        client.set_terminated(run_id, "FINISHED")


def set_run_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    """Tags on an existing (finished) run."""
    from mlflow.entities import RunTag

    _client().log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def flow_process() -> str:
    """This process as `host:pid:start time`: the owner of a flow's parent run. The start time tells a
    process from a later one given the same pid."""
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def flow_process_alive(owner: str) -> bool:
    """Whether the process `flow_process` named, on this host, still runs."""
    import psutil

    _, pid, started = owner.rsplit(":", 2)
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" == started
    except psutil.AccessDenied:  # another user's process: alive
        return True
    except (psutil.NoSuchProcess, ValueError):
        return False


class FlowTracking:
    """A flow's MLflow runs: a parent, and children of it (the ablation's points)."""

    def __init__(self, repo_dir: Path, experiment: str) -> None:
        import mlflow

        self.uri = tracking_uri(repo_dir)
        self.client = mlflow.MlflowClient(self.uri)
        self.experiment_id = experiment_id(self.client, experiment)

    def start(self, name: str, tags: Mapping[str, Any], parent: str | None = None) -> str:
        """A run: a flow's parent (tagged with the process that owns it) or, with `parent`, its child."""
        tags = {k: str(v) for k, v in tags.items()}
        if parent:
            tags["mlflow.parentRunId"] = parent
        else:
            tags[FLOW_PROCESS_TAG] = flow_process()
        return self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id

    def end_stopped(self, tags: Mapping[str, str]) -> int:
        """Runs carrying `tags` still marked running, which a flow stopped before it could end them (a
        killed process, a session's end), marked KILLED: the flow run again by its name starts its own.
        How many there were."""
        query = f"{tags_query(tags)} and attributes.status = 'RUNNING'"
        stopped = self.client.search_runs([self.experiment_id], query, max_results=1000)
        for run in stopped:
            self.client.set_terminated(run.info.run_id, "KILLED")
        return len(stopped)

    def end_orphaned(self) -> int:
        """Flows' parent runs still marked running whose process on this host has gone (a sweep killed
        and never run again by its name), marked KILLED with their running children. Parents owned by
        another host are left as they are: whether that process lives cannot be told from here. How
        many runs were marked."""
        running = "attributes.status = 'RUNNING'"
        host = socket.gethostname()
        parents = self.client.search_runs(
            [self.experiment_id], f"tags.`{FLOW_PROCESS_TAG}` LIKE '%:%' and {running}", max_results=1000
        )
        ended = 0
        for parent in parents:
            owner = parent.data.tags[FLOW_PROCESS_TAG]
            if owner.rsplit(":", 2)[0] != host or flow_process_alive(owner):
                continue
            owned = tags_query({"mlflow.parentRunId": parent.info.run_id})
            children = self.client.search_runs([self.experiment_id], f"{owned} and {running}")
            for run in [parent, *children]:
                self.client.set_terminated(run.info.run_id, "KILLED")
            ended += 1 + len(children)
        return ended

    def log(self, run_id: str, metrics: Mapping[str, float], params: Mapping[str, Any] | None = None) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if not math.isnan(float(v))],
            params=[Param(k, str(v)[:6000]) for k, v in (params or {}).items()],
        )
