"""Fan-out across machines, simulated on one: a bare git repository as the git remote, a folder as the
DVC remote, one MLflow server and one Prefect server on free 127.0.0.1 ports, and two process workers,
each in its own clone of the project with its own DVC cache, so nothing is shared but the remotes. A
sweep with --pool runs one point on each worker, runs a point again on the other worker when its
worker is killed mid-point, reports a point that fails, and compares exactly as its points run
locally."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from flows.common import PipelineError
from flows.dispatch import Refused, checked_in, checkout, marked_run, params_diff, reset_interrupted_run
from tests.project import TWO_KEY_SWEEP, command_env, copy_project, dvc_stages, sh
from tests.services import (
    BIN,
    free_port,
    kill_machine,
    prefect,
    prefect_env,
    prefect_server,
    start,
    stop,
    wait_until_up,
)
from tests.workdir import ROOT

WORKERS = ("w1", "w2")


@dataclass(frozen=True)
class Site:
    root: Path
    project: Path  # where the user starts sweeps
    clones: dict[str, Path]  # each worker's checkout


@pytest.fixture(scope="module")
def site(reproduced_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The project with its baseline reproduced, committed and pushed; the workers' clones of it."""
    root = tmp_path_factory.mktemp("fanout")
    origin = root / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    project = copy_project(reproduced_template, root / "project")
    sh(project, "dvc", "remote", "add", "-d", "shared", str(root / "dvc-remote"))
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "baseline reproduced, DVC remote")
    sh(project, "git", "remote", "add", "origin", str(origin))
    sh(project, "git", "push", "-q", "origin", "main")
    clones = {}
    for name in WORKERS:
        clones[name] = root / name
        subprocess.run(["git", "clone", "-q", str(origin), str(clones[name])], check=True)
    return Site(root, project, clones)


@dataclass(frozen=True)
class Cluster:
    env: dict[str, str]  # of the user's shell: the Prefect server, the MLflow server
    workers: dict[str, subprocess.Popen]
    logs: Path


@pytest.fixture(scope="module")
def servers(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The servers, the pool with its point deployment, one worker per clone (one run at a time each,
    as on a one-GPU machine); all stopped at the end of the module."""
    logs = tmp_path_factory.mktemp("fanout-logs")
    mlflow_port = free_port()
    tracking = f"http://127.0.0.1:{mlflow_port}"
    env = prefect_env(logs / "prefect", free_port(), MLFLOW_TRACKING_URI=tracking)
    processes: list[subprocess.Popen] = []
    workers: dict[str, subprocess.Popen] = {}
    try:
        log = logs / "mlflow.log"
        server = start(
            [
                str(BIN / "mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(mlflow_port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{site.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(site.root / "mlartifacts"),
            ],
            log,
            env,
        )
        processes.append(server)
        wait_until_up(f"{tracking}/health", server, log)
        processes.append(prefect_server(env, logs / "prefect.log"))
        prefect(env, "work-pool", "create", "cpu", "--type", "process")
        deployments = ("ablation-point-cpu", "pipeline-stage-cpu")
        prefect(env, "--no-prompt", "deploy", *(f"--name={name}" for name in deployments), cwd=ROOT)
        yield Cluster(env, workers, logs)
    finally:
        stop(*workers.values(), *reversed(processes))
    assert all(process.poll() is not None for process in [*workers.values(), *processes])


@pytest.fixture
def cluster(site: Site, servers: Cluster) -> Cluster:
    """The servers with both workers up: one a test killed is started again."""
    for name, clone in site.clones.items():
        if name not in servers.workers or servers.workers[name].poll() is not None:
            worker_env = {**servers.env, "LMPIPE_CHECKOUT": str(clone), "PYTHONPATH": str(clone)}
            command = [
                str(BIN / "prefect"),
                "worker",
                "start",
                "--pool",
                "cpu",
                "--name",
                name,
                "--limit",
                "1",
            ]
            servers.workers[name] = start(command, servers.logs / f"{name}.log", worker_env, cwd=clone)
    return servers


def flow_runs(env: dict[str, str], name_like: str) -> list[dict]:
    """The flow runs whose name contains `name_like`, from the server's REST API."""
    request = urllib.request.Request(
        env["PREFECT_API_URL"] + "/flow_runs/filter",
        data=json.dumps({"flow_runs": {"name": {"like_": name_like}}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def logs(cluster: Cluster) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(cluster.logs.glob("*.log")))


@pytest.mark.slow
def test_a_pooled_sweep_survives_a_killed_worker_reports_a_failed_point_and_compares_as_locally(
    site: Site, cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """pooled-1 and pooled-2 start one on each worker; pooled-2's worker is killed mid-point and the
    point runs again on the other one. pooled-3 fails for good (its loss diverges): not retried, reported
    with its error line. The completed points compare exactly as the same points run locally."""
    grid = json.dumps([*TWO_KEY_SWEEP, {"objectives.mlm.mask_rate": 0.3, "pretrain.lr": 1.0e6}])
    command = [sys.executable, "-m", "flows.ablation", "--grid", grid, "--name", "pooled", "--pool", "cpu"]
    parent = start(
        [*command, "--max-parallel", "2"], cluster.logs / "sweep.log", cluster.env, cwd=site.project
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            running = [r for r in flow_runs(cluster.env, "pooled-2-try1") if r["state_type"] == "RUNNING"]
            if running:
                break
            assert parent.poll() is None and time.monotonic() < deadline, logs(cluster)
            time.sleep(1)
        time.sleep(5)  # into the point's work
        victim = running[0]["labels"]["prefect.worker.name"]
        kill_machine(cluster.workers[victim])
        assert parent.wait(timeout=800) == 1, logs(cluster)  # a point failed
    finally:
        stop(parent)
    [survivor] = set(WORKERS) - {victim}
    runs = {run["name"]: run for run in flow_runs(cluster.env, "pooled-")}
    assert set(runs) == {"pooled-1-try1", "pooled-2-try1", "pooled-2-try2", "pooled-3-try1"}
    worker = {name: run["labels"]["prefect.worker.name"] for name, run in runs.items()}
    assert {worker["pooled-1-try1"], worker["pooled-2-try1"]} == set(WORKERS)  # one point on each
    assert runs["pooled-1-try1"]["state_type"] == "COMPLETED"
    assert runs["pooled-2-try1"]["state_type"] == "CRASHED"
    assert runs["pooled-2-try2"]["state_type"] == "COMPLETED" and worker["pooled-2-try2"] == survivor
    assert runs["pooled-3-try1"]["state_type"] == "FAILED"
    sweep_log = (cluster.logs / "sweep.log").read_text()
    nan = "error: pretrain@encoder_mlm: the loss became nan at step "  # which step: the data's
    assert "1 point(s) failed: pooled-3: failed on w" in sweep_log and nan in sweep_log

    summary = (site.project / "reports/ablation/pooled/comparison.md").read_text()
    assert "Points ran on work pool `cpu`" in summary
    assert f"| pooled-1 | completed on {worker['pooled-1-try1']} |" in summary
    assert f"| pooled-2 | crashed on {victim}: " in summary and f"; then completed on {survivor} |" in summary
    assert "| pooled-3 | failed on w" in summary and nan in summary

    # the same points run locally (test_flows.py reads that sweep): the same numbers, verdicts and losses
    pooled_table = pd.read_csv(site.project / "reports/ablation/pooled/comparison.csv")
    # asked for only now: another pytest-xdist worker has usually built it meanwhile (this one would wait)
    swept_template = request.getfixturevalue("swept_template")
    local_table = pd.read_csv(swept_template / "reports/ablation/grid/comparison.csv")
    assert list(pooled_table["experiment"]) == ["pooled-1", "pooled-2"]
    pd.testing.assert_frame_equal(
        pooled_table.drop(columns="experiment"), local_table.drop(columns="experiment")
    )

    # the experiments went through the git remote; the parent run link holds across machines
    remote_refs = sh(site.project, "git", "ls-remote", "origin").stdout
    assert "pooled-1" in remote_refs and "pooled-2" in remote_refs
    client = mlflow.MlflowClient(cluster.env["MLFLOW_TRACKING_URI"])
    experiment_id = client.get_experiment_by_name("lmpipe").experiment_id
    [parent_run] = client.search_runs([experiment_id], "tags.sweep = 'pooled' and tags.stage = 'ablation'")
    points = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run.info.run_id}'")
    last_try = {"pooled-1": "pooled-1-try1", "pooled-2": "pooled-2-try2", "pooled-3": "pooled-3-try1"}
    assert {p.data.tags["dvc_experiment"]: p.data.tags["worker"] for p in points} == {
        point: worker[attempt] for point, attempt in last_try.items()
    }
    for point in points:
        float(point.data.tags["dispatch_s"])
        if point.data.tags["dvc_experiment"] in set(pooled_table["experiment"]):
            stages = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{point.info.run_id}'")
            assert {run.data.tags["stage"] for run in stages} == {
                "pretrain",
                "export",
                "finetune",
                "evaluate",
            }
    print(summary)  # the dispatch figures the README quotes (pytest -s)


def worker_clone(site: Site, tmp_path: Path) -> tuple[Path, str]:
    """A fresh clone of the git remote, as a worker's checkout, and its HEAD."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(site.root / "origin.git"), str(clone)], check=True)
    return clone, sh(clone, "git", "rev-parse", "HEAD").stdout.strip()


def edit_params(clone: Path) -> None:
    """An uncommitted edit of the kind an owner makes."""
    (clone / "params.yaml").write_text((clone / "params.yaml").read_text() + "\n# edited\n")


def test_workers_run_only_the_pushed_commit(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent refuses uncommitted or unpushed work; a worker refuses a commit it is not at."""
    clone, head = worker_clone(site, tmp_path)
    assert checked_in(clone, "origin") == head

    edit_params(clone)
    with pytest.raises(PipelineError, match=r"^--pool: .* has uncommitted changes \(M params.yaml\)"):
        checked_in(clone, "origin")
    sh(clone, "git", "commit", "-qam", "local only")
    with pytest.raises(PipelineError, match=r"is not on git remote 'origin': push it first$"):
        checked_in(clone, "origin")

    monkeypatch.chdir(clone)
    with pytest.raises(
        Refused, match=rf"checkout {clone} is at \w{{12}}, the run needs {head[:12]}: update it"
    ):
        checkout(head)
    assert checkout(sh(clone, "git", "rev-parse", "HEAD").stdout.strip()) == clone


# `dvc exp run` killed right after it applied the params to the checkout: the window in which a
# machine failure once left a CI worker's checkout changed, so that it refused every later run
KILLED_MID_EXP_RUN = """
import os, signal
from pathlib import Path
from dvc.cli import main
from dvc.repo.experiments.queue.base import BaseStashQueue
from flows.dispatch import marked_run

BaseStashQueue._stash_commit_deps = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
with marked_run(Path.cwd()):
    main(["exp", "run", "--temp", "-S", "pretrain.lr=0.5", "pack"])
"""


def test_a_worker_resets_what_a_killed_run_left_in_its_checkout_and_nothing_else(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone, head = worker_clone(site, tmp_path)
    monkeypatch.chdir(clone)
    monkeypatch.setenv("PREFECT__WORKER_NAME", "w9")

    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_EXP_RUN], env=command_env(PYTHONPATH=str(clone))
    )
    assert killed.wait(timeout=120) == -9
    assert sh(clone, "git", "status", "--porcelain", "--untracked-files=no").stdout.startswith(
        "M  params.yaml"
    )
    assert sh(clone, "git", "symbolic-ref", "-q", "HEAD", check=False).returncode == 1  # detached
    with pytest.raises(Refused, match=r"has uncommitted changes \(M  params.yaml\)$"):
        checkout(head)

    assert reset_interrupted_run(clone) == (
        f"worker w9: the run of process {killed.pid} died while it had {clone} changed; reset it to main"
    )
    assert checkout(head) == clone
    assert sh(clone, "git", "symbolic-ref", "HEAD").stdout.strip() == "refs/heads/main"
    assert reset_interrupted_run(clone) is None  # the marker went with the reset

    # the owner's edits, and a run in progress (a live process's marker), are not the worker's to undo
    edit_params(clone)
    assert reset_interrupted_run(clone) is None
    with marked_run(clone):
        assert reset_interrupted_run(clone) is None
    with pytest.raises(Refused, match=r"has uncommitted changes \(M params.yaml\)$"):
        checkout(head)


KILLED_MID_PULL = """
import os, signal
from pathlib import Path
import dvc_objects.fs.local as local
from dvc.cli import main
from flows.dispatch import marked_run

copyfile = local.copyfile
def die_mid_copy(source, temporary, *args, **kwargs):  # half the file, under its temporary name
    if "checkpoints/encoder_mlm/hf" not in temporary:  # the run cache, when a sweep has pushed one
        return copyfile(source, temporary, *args, **kwargs)
    data = Path(source).read_bytes()
    Path(temporary).write_bytes(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)
local.copyfile = die_mid_copy
with marked_run(Path.cwd()):
    main(["pull", "--run-cache", "--allow-missing", "checkpoints/encoder_mlm/hf"])
"""


def test_a_worker_clears_what_a_pull_killed_mid_copy_left_in_an_output(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed while its pull copies an output into the checkout leaves DVC's temporary file
    there, which every later pull refuses to remove; the next run clears it with the marker's reset."""
    clone, head = worker_clone(site, tmp_path)
    sh(clone, "dvc", "cache", "dir", "--local", str(site.project / ".dvc/cache"))  # the outputs to copy
    monkeypatch.chdir(clone)
    monkeypatch.setenv("PREFECT__WORKER_NAME", "w9")

    killed = subprocess.Popen([sys.executable, "-c", KILLED_MID_PULL], env=command_env(PYTHONPATH=str(clone)))
    assert killed.wait(timeout=120) == -9
    [temporary] = (clone / "checkpoints/encoder_mlm/hf").glob(".*.tmp")
    refused = sh(clone, "dvc", "pull", "--allow-missing", check=False)
    assert refused.returncode == 1 and "Can't remove the following unsaved files" in refused.stderr

    assert reset_interrupted_run(clone) == (
        f"worker w9: the run of process {killed.pid} died while it had {clone} changed; reset it to main"
    )
    assert not temporary.exists()
    assert checkout(head) == clone
    sh(clone, "dvc", "pull", "--allow-missing")
    assert sh(clone, "dvc", "status", "--json").stdout.strip() == "{}"


@pytest.mark.slow
def test_a_pooled_pipeline_runs_its_gpu_stages_on_the_workers(site: Site, cluster: Cluster) -> None:
    def pipeline() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "flows.pipeline", "--pool", "cpu", "-S", "pretrain.lr=0.002"],
            cwd=site.project,
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=900,
        )

    stages = len(dvc_stages(site.project))
    try:
        first = pipeline()
        assert first.returncode == 0, f"{first.stdout}\n{first.stderr}\n{logs(cluster)}"
        # pretraining and its fine-tune changed (not its baseline's jobs); export and evaluate run here
        assert first.stdout.strip().splitlines()[-1].startswith(f"4 ran, {stages - 4} up to date")
        runs = flow_runs(cluster.env, "stage-")
        assert sorted(run["name"].rsplit("-", 1)[0].split("-", 2)[-1] for run in runs) == [
            "finetune.encoder_mlm",
            "pretrain.encoder_mlm",
        ]
        assert {run["state_type"] for run in runs} == {"COMPLETED"}
        assert {run["labels"]["prefect.worker.name"] for run in runs} <= set(WORKERS)
        assert sh(site.project, "dvc", "status", "--json").stdout.strip() == "{}"  # dvc.lock has them

        second = pipeline()
        assert second.returncode == 0, f"{second.stdout}\n{second.stderr}"
        assert second.stdout.strip().splitlines()[-1].startswith(f"0 ran, {stages} up to date")
        assert len(flow_runs(cluster.env, "stage-")) == len(runs)  # nothing dispatched
    finally:  # the baseline again, for the other tests
        sh(site.project, "git", "checkout", "params.yaml", "dvc.lock")
        sh(site.project, "dvc", "checkout", "--force")


def test_uncommitted_params_travel_as_overrides_that_rebuild_them(tmp_path: Path) -> None:
    committed = {
        "pretrain": {"lr": 0.001, "models": {}},
        "models": {"encoder_mlm": {"arch": "encoder"}, "decoder_clm": {"arch": "decoder"}},
        "glue": {"tasks": ["sst2", "cola"], "path": "a b"},
    }
    workspace = {
        "pretrain": {"lr": 0.002, "models": {"encoder_mlm": {"max_steps": 30}}},
        "models": {"encoder_mlm": {"arch": "encoder"}},
        "glue": {"tasks": ["sst2"], "path": "a b"},
        "seed": 7,
    }
    overrides = params_diff(committed, workspace)
    assert "~models.decoder_clm" in overrides and "pretrain.lr=0.002" in overrides
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(committed))
    apply_overrides(str(tmp_path / "params.yaml"), overrides)  # as `dvc exp run -S` applies them
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == workspace
    assert params_diff(workspace, workspace) == []
