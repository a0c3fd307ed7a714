"""Fan-out across machines: sweep points and GPU stages as flow runs of deployments on a work pool.

`flows.ablation --pool <pool>` and `flows.pipeline --pool <pool>` start every point (every stage with
`meta.gpu`) with Prefect's `run_deployment`, so whichever worker of the pool is free takes it. The
flow run works in the worker's checkout of the project (`LMPIPE_CHECKOUT`, which the deployments'
pull step moves into), refuses any other commit than the parent's, pulls what it needs from the DVC
remote, runs as a DVC experiment (`dvc exp run --temp --pull`), and only when that succeeded pushes
the experiment to the git remote and its outputs and run cache to the DVC remote. The parent pulls
them back, so nothing but the remotes is shared and nothing half-written reaches them.

A worker that dies mid-run stops sending heartbeats (`PREFECT_FLOWS_HEARTBEAT_FREQUENCY`, a job
variable in prefect.yaml); the automation of `ensure_crash_detection` marks its flow run Crashed and
the parent runs it again on any worker of the pool, at most `retries` more times. A run that fails
(its stage raised, or the worker refused the commit) is not retried: it would fail the same way.
A worker killed while `dvc exp run` had its checkout changed (the params applied, HEAD detached) finds
its run's marker the next time and resets the checkout, where it would otherwise refuse every run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger

from flows.common import (
    PARAMS_OVERRIDES_ENV,
    PipelineError,
    dvc,
    dvc_checked,
    exp_run,
    git,
    hydra_value,
    last_line,
    stages_ran,
)
from lmpipe.params.schema import PARAMS_FILE, read_params_yaml
from lmpipe.runtime import write_json
from lmpipe.tracking import child_env

CHECKOUT_ENV = "LMPIPE_CHECKOUT"  # the worker's checkout; prefect.yaml's pull step moves there
WORKER_LABEL = "prefect.worker.name"  # the label a worker gives the flow runs it takes
CRASH_AUTOMATION = "lmpipe: crash flow runs without heartbeats"
HEARTBEAT_WINDOW_S = 75  # 2.5 heartbeats of prefect.yaml's 30 s: then the worker is gone
DISPATCH_TAG = "dispatch_s"  # on the point's MLflow run: seconds from submit to its first stage
POLL_S = 2.0
RUN_MARKER = Path(".dvc/tmp/lmpipe-worker-run.json")  # in a worker's checkout while a run changes it


# what may differ from the commit: params.yaml travels as overrides (`params_diff`), dvc.lock is the
# pipeline's bookkeeping (the workers restore what ran here from the run cache)
_TRAVELS = (str(PARAMS_FILE), "dvc.lock")


def checked_in(repo_dir: Path, git_remote: str) -> str:
    """The commit the workers must run: HEAD, with no uncommitted change to a tracked file the
    workers would not see, and present on `git_remote` (they could not fetch it otherwise)."""
    status = git(repo_dir, "status", "--porcelain", "--untracked-files=no").splitlines()
    dirty = [line for line in status if line[3:] not in _TRAVELS]
    if dirty:
        raise PipelineError(
            f"--pool: {repo_dir} has uncommitted changes ({dirty[0].strip()}); the workers run commits: "
            "commit and push them first"
        )
    revision = git(repo_dir, "rev-parse", "HEAD")
    git(repo_dir, "fetch", "--quiet", git_remote)
    if not git(repo_dir, "branch", "--remotes", "--contains", revision):
        raise PipelineError(
            f"--pool: commit {revision[:12]} is not on git remote '{git_remote}': push it first"
        )
    return revision


def params_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`dvc exp run -S` overrides that turn params `old` into `new` (`+key=` adds, `~key` deletes)."""
    overrides = []
    for key, value in new.items():
        dotted = f"{prefix}{key}"
        if key not in old:
            overrides.append(f"+{dotted}={hydra_value(value)}")
        elif isinstance(value, Mapping) and isinstance(old[key], Mapping):
            overrides += params_diff(old[key], value, f"{dotted}.")
        elif value != old[key]:
            overrides.append(f"{dotted}={hydra_value(value)}")
    return overrides + [f"~{prefix}{key}" for key in old if key not in new]


def workspace_overrides(repo_dir: Path) -> list[str]:
    """The workspace's params.yaml as overrides of the committed one."""
    committed = yaml.safe_load(git(repo_dir, "show", "HEAD:params.yaml")) or {}
    return params_diff(committed, read_params_yaml(repo_dir / PARAMS_FILE) or {})


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def tracking_server(uri: str) -> str:
    if not uri.startswith(("http://", "https://")):
        raise PipelineError(
            f"--pool: MLflow tracking URI '{uri}' is not a server the workers can reach: "
            "set MLFLOW_TRACKING_URI=http://host:port (mlflow server)"
        )
    return uri


def deployment_name(flow_name: str, pool: str) -> str:
    """prefect.yaml's deployment of a dispatched flow on a pool: `<flow>/<flow>-<pool>`."""
    return f"{flow_name}/{flow_name}-{pool}"


@dataclass(frozen=True)
class Target:
    """Where dispatched work runs: a work pool, the remotes it shares results through, the commit."""

    pool: str
    revision: str
    tracking_uri: str
    git_remote: str = "origin"
    dvc_remote: str | None = None  # None: the project's default DVC remote
    device_overrides: tuple[str, ...] = ()  # the pool's LMPIPE_PARAMS_OVERRIDES (its job variables)
    workspace_overrides: tuple[str, ...] = ()  # params.yaml's uncommitted changes

    def deployment(self, flow_name: str) -> str:
        return deployment_name(flow_name, self.pool)

    def dvc_remote_args(self) -> list[str]:
        return ["--remote", self.dvc_remote] if self.dvc_remote else []

    def overrides(self, explicit: Sequence[str]) -> list[str]:
        """What a dispatched run sets on top of the commit: the workspace's params, the pool's device
        settings over them (as a local flow writes them into params.yaml), `explicit` over both."""
        given = {_key(o) for o in explicit}
        device = [o for o in self.device_overrides if _key(o) not in given]
        given |= {_key(o) for o in device}
        return [*(o for o in self.workspace_overrides if _key(o) not in given), *device, *explicit]


def pool_target(
    repo_dir: Path, pool: str, flow_name: str, tracking_uri: str, git_remote: str, dvc_remote: str | None
) -> Target:
    """Everything checked before the first dispatch, one line each: the commit is pushed, MLflow is a
    server, the pool's deployment of `flow_name` exists (its device settings are read from it), the
    crash detection is on."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    revision = checked_in(repo_dir, git_remote)
    deployment = deployment_name(flow_name, pool)
    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployment_by_name(deployment)
        except ObjectNotFound:
            raise PipelineError(
                f"--pool {pool}: no deployment {deployment} on the Prefect server "
                "(prefect.yaml defines it for the pools cpu and gpu: prefect --no-prompt deploy --all)"
            ) from None
    env = (found.job_variables or {}).get("env") or {}
    ensure_crash_detection()
    workspace = workspace_overrides(repo_dir)
    return Target(
        pool=pool,
        revision=revision,
        tracking_uri=tracking_server(tracking_uri),
        git_remote=git_remote,
        dvc_remote=dvc_remote,
        device_overrides=tuple(str(env.get(PARAMS_OVERRIDES_ENV, "")).split()),
        workspace_overrides=tuple(workspace),
    )


@dataclass(frozen=True)
class Attempt:
    flow_run: str
    worker: str
    state: str  # COMPLETED, FAILED, CRASHED, ...
    message: str

    def line(self) -> str:
        text = f"{self.state.lower()} on {self.worker}"
        return f"{text}: {self.message}" if self.state != "COMPLETED" and self.message else text


def _reason(message: str | None) -> str:
    """A state message without Prefect's preamble: from a stage's `error:` line when there is one."""
    line = last_line(message) if message else ""
    return line[line.index("error: ") :] if "error: " in line else line


class DispatchFailed(RuntimeError):
    def __init__(self, label: str, attempts: Sequence[Attempt]) -> None:
        super().__init__(f"{label}: " + "; then ".join(a.line() for a in attempts))
        self.attempts = list(attempts)


def dispatch(
    target: Target, flow_name: str, parameters: Mapping[str, Any], label: str, retries: int
) -> list[Attempt]:
    """Run `flow_name`'s deployment on the pool until it completes; a crashed run is started again
    (on whichever worker is free), `retries` times at most. Returns the attempts; raises
    DispatchFailed when the last one did not complete."""
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    attempts: list[Attempt] = []
    for number in range(1, retries + 2):
        flow_run = run_deployment(
            target.deployment(flow_name),
            parameters={**parameters, "submitted_at": time.time()},
            flow_run_name=f"{label}-try{number}",
            timeout=None,
            poll_interval=POLL_S,
        )
        state = flow_run.state
        attempt = Attempt(
            flow_run=flow_run.name,
            worker=(flow_run.labels or {}).get(WORKER_LABEL, "no worker"),
            state=state.type.value if state else "UNKNOWN",
            message=_reason(state.message if state else None),
        )
        attempts.append(attempt)
        logger.info("%s: attempt %d %s", label, number, attempt.line())
        if attempt.state != "CRASHED":
            break
    if attempts[-1].state != "COMPLETED":
        raise DispatchFailed(label, attempts)
    return attempts


def ensure_crash_detection() -> None:
    """The server-side automation that marks a flow run Crashed when its heartbeats stop (Prefect's
    zombie-flow recipe); created once per server."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    try:
        Automation.read(name=CRASH_AUTOMATION)
        return
    except ValueError:
        pass
    Automation(
        name=CRASH_AUTOMATION,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=HEARTBEAT_WINDOW_S),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {HEARTBEAT_WINDOW_S} s: the worker is gone",
            )
        ],
    ).create()


# --- the worker's side -------------------------------------------------------------------------


class Refused(Exception):
    """The worker cannot run this commit: one line, the flow run fails (and is not retried)."""


def worker_name() -> str:
    return os.environ.get("PREFECT__WORKER_NAME") or socket.gethostname()


def checkout(revision: str) -> Path:
    """The worker's checkout (the working directory), at `revision` with nothing uncommitted."""
    here = Path.cwd()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    if head.returncode != 0:
        raise Refused(
            f"worker {worker_name()}: {here} is not a git checkout of the project (set {CHECKOUT_ENV})"
        )
    if head.stdout.strip() != revision:
        raise Refused(
            f"worker {worker_name()}: checkout {here} is at {head.stdout.strip()[:12]}, the run needs "
            f"{revision[:12]}: update it (git fetch && git checkout {revision[:12]}) and run again"
        )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True
    ).stdout.splitlines()
    if dirty:
        raise Refused(f"worker {worker_name()}: checkout {here} has uncommitted changes ({dirty[0].strip()})")
    return here


@contextmanager
def marked_run(here: Path) -> Iterator[None]:
    """Marks the checkout `here` (clean at this point) as changed by this process until the block ends.
    `dvc pull` writes the outputs through temporary files, and `dvc exp run --temp` applies the params
    to the checkout itself, detaches HEAD and stages them before it copies the run away; a SIGKILL in
    either leaves them behind, and the marker is how the next run tells them from edits of the
    machine's owner."""
    marker = here / RUN_MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=here, capture_output=True, text=True)
    record = {"pid": os.getpid(), "head": head.stdout.strip() or git(here, "rev-parse", "HEAD")}
    write_json(marker, record)  # whole or not at all: a SIGKILL may come at any time
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def reset_interrupted_run(here: Path) -> str | None:
    """Resets the checkout `here` to its HEAD (and HEAD to the branch it was on) and its DVC outputs
    to that commit's when a marked run's process died without unmarking it; returns what it did, or
    None when there was nothing to do. A marked run whose process lives (a worker started with
    `--limit` above 1) is left alone."""
    marker = here / RUN_MARKER
    if not marker.exists():
        return None
    record = json.loads(marker.read_text())
    if process_alive(record["pid"]):
        return None
    git(here, "reset", "-q", "--hard")
    head = record["head"]
    if head.startswith("refs/heads/") and git(here, "rev-parse", head) == git(here, "rev-parse", "HEAD"):
        git(here, "symbolic-ref", "HEAD", head)
    # a pull killed mid-copy leaves DVC's temporary file in an output, which every later pull refuses
    # to remove ("unsaved files"): the commit's outputs again, from the local cache
    dvc_checked(here, "checkout", "--force", "--allow-missing")
    marker.unlink()
    return (
        f"worker {worker_name()}: the run of process {record['pid']} died while it had {here} changed; "
        f"reset it to {head.removeprefix('refs/heads/')}"
    )


def experiment_on_worker(
    experiment: str,
    overrides: Sequence[str],
    targets: Sequence[str],
    *,
    revision: str,
    parent_run_id: str,
    tracking_uri: str,
    git_remote: str,
    dvc_remote: str | None,
    submitted_at: float,
    tag_parent: bool,
) -> list[str]:
    """What a dispatched point or stage does on its worker; returns the stages that ran. With
    `tag_parent` (a point: its own MLflow run) the worker and its dispatch time go on the parent run."""
    logger = get_run_logger()
    if reset := reset_interrupted_run(Path.cwd()):
        logger.warning(reset)
    here = checkout(revision)
    remote = ["--remote", dvc_remote] if dvc_remote else []
    uri = os.environ.get("MLFLOW_TRACKING_URI") or tracking_uri
    env = child_env(parent_run_id, uri)
    with marked_run(here):
        # the run history of every machine, so that stages another one ran are restored, not re-run
        dvc_checked(here, "pull", "--run-cache", "--allow-missing", *remote)
        dvc(here, "exp", "remove", experiment)  # a failed earlier attempt's on this machine, if any
        waited = time.time() - submitted_at
        logger.info("%s on %s: first stage %.1f s after submit", experiment, worker_name(), waited)
        if tag_parent:
            import mlflow

            client = mlflow.MlflowClient(uri)
            client.set_tag(parent_run_id, "worker", worker_name())
            client.set_tag(parent_run_id, DISPATCH_TAG, f"{waited:.1f}")
        output = dvc_checked(here, *exp_run(experiment, overrides, targets, pull=True), env=env)
    ran = stages_ran(output)
    logger.info("%s: ran %s", experiment, ", ".join(ran) or "nothing (all cached)")
    dvc_checked(here, "exp", "push", "--force", "--run-cache", *remote, git_remote, experiment)
    return ran


@flow(name="ablation-point", log_prints=True)
def ablation_point(
    experiment: str,
    overrides: list[str],
    revision: str,
    parent_run_id: str,
    tracking_uri: str,
    git_remote: str = "origin",
    dvc_remote: str | None = None,
    submitted_at: float = 0.0,
    targets: list[str] | None = None,
) -> list[str]:
    """One point of a sweep on this worker: `dvc exp run --temp --name <experiment> -S ... [targets]`,
    pushed. `overrides` are complete (the parent put the pool's device settings in), so the parent
    knows every param of the run."""
    return experiment_on_worker(
        experiment,
        overrides,
        targets or [],
        revision=revision,
        parent_run_id=parent_run_id,
        tracking_uri=tracking_uri,
        git_remote=git_remote,
        dvc_remote=dvc_remote,
        submitted_at=submitted_at,
        tag_parent=True,
    )


@flow(name="pipeline-stage", log_prints=True)
def pipeline_stage(
    stage: str,
    experiment: str,
    overrides: list[str],
    revision: str,
    parent_run_id: str,
    tracking_uri: str,
    git_remote: str = "origin",
    dvc_remote: str | None = None,
    submitted_at: float = 0.0,
) -> list[str]:
    """One stage of the parent's pipeline (and whatever of its upstream the run cache does not
    restore) on this worker, as the experiment `experiment`; pushed with its run cache, which is how
    the parent's `dvc repro` restores the stage without running it."""
    return experiment_on_worker(
        experiment,
        overrides,
        [stage],
        revision=revision,
        parent_run_id=parent_run_id,
        tracking_uri=tracking_uri,
        git_remote=git_remote,
        dvc_remote=dvc_remote,
        submitted_at=submitted_at,
        tag_parent=False,
    )
