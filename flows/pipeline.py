"""The DVC graph as a Prefect flow: one task per stage, upstream first, independent stages at once.

The graph is DVC's own (`Repo.index.graph` over dvc.yaml), never a copy. A task does what
`dvc repro --single-item <stage>` does, in three steps so that DVC's repository lock is held only for
the bookkeeping and independent stages really run side by side (one `dvc repro` holds the lock for its
whole run): `dvc status <stage>` (skip when up to date), the stage's command as dvc.yaml writes it,
`dvc commit <stage>` (outputs into the cache, hashes into dvc.lock). Stages whose dvc.yaml `meta`
says `gpu: true` share `gpu_slots` and carry the Prefect tag `gpu` (so a tag concurrency limit on a
server caps them across flows too); `meta.retries` retries a stage with exponential backoff.

    python -m flows.pipeline                     # the whole graph
    python -m flows.pipeline --target evaluate -S objectives.mlm.mask_rate=0.2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import State, flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import as_completed
from prefect.states import Cancelled, Completed
from prefect.tasks import exponential_backoff

from flows.common import (
    FlowFailed,
    PipelineError,
    apply_overrides,
    check_overrides,
    cli,
    dvc,
    dvc_checked,
    last_line,
    pool_overrides,
    stage_env,
    threads_each,
)
from flows.dispatch import Target, dispatch, pool_target
from lmpipe.params.schema import PARAMS_FILE
from lmpipe.tracking import PARENT_RUN_ENV, FlowTracking, child_env, tracking_experiment, tracking_uri

_TAIL_LINES = 20  # of a stage's output, logged when it finishes


@dataclass(frozen=True)
class StageNode:
    name: str
    cmds: tuple[str, ...]
    wdir: str
    upstream: tuple[str, ...]
    gpu: bool
    retries: int


@dataclass
class Summary:
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # up to date
    failed: dict[str, str] = field(default_factory=dict)  # stage -> its error line
    not_run: list[str] = field(default_factory=list)  # downstream of a failure
    seconds: dict[str, float] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # a dispatched stage -> its attempts on the pool

    def line(self) -> str:
        return (
            f"{len(self.ran)} ran, {len(self.skipped)} up to date, {len(self.failed)} failed, "
            f"{len(self.not_run)} not run"
        )

    def markdown(self) -> str:
        rows = [
            f"| {name} | ran{' (' + self.where[name] + ')' if name in self.where else ''} | "
            f"{self.seconds[name]:.1f} |"
            for name in self.ran
        ]
        rows += [f"| {name} | up to date | {self.seconds[name]:.1f} |" for name in self.skipped]
        rows += [
            f"| {name} | failed: {error} | {self.seconds[name]:.1f} |" for name, error in self.failed.items()
        ]
        rows += [f"| {name} | not run (upstream failed) | |" for name in self.not_run]
        return "\n".join([f"**{self.line()}**", "", "| Stage | Result | Seconds |", "|---|---|---|", *rows])


class StageFailed(FlowFailed):
    def __init__(self, summary: Summary) -> None:
        super().__init__(f"{summary.line()}: " + "; ".join(f"{k}: {v}" for k, v in summary.failed.items()))
        self.summary = summary


def read_graph(repo_dir: Path) -> dict[str, StageNode]:
    """Every stage of dvc.yaml (foreach/matrix expanded) with its upstream stages, in DVC's order."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    def address(stage: Any) -> str:  # as `dvc repro` takes it when run from the repo's root
        dvcfile = Path(stage.path)
        return (
            stage.name
            if dvcfile == repo_dir / "dvc.yaml"
            else f"{dvcfile.relative_to(repo_dir)}:{stage.name}"
        )

    try:
        with Repo(str(repo_dir)) as repo:
            graph = repo.index.graph
            nodes = {}
            for stage in repo.index.stages:
                if not stage.cmd:
                    continue  # a data source (.dvc file), nothing to run
                meta = stage.meta or {}
                nodes[address(stage)] = StageNode(
                    name=address(stage),
                    cmds=tuple([stage.cmd] if isinstance(stage.cmd, str) else stage.cmd),
                    wdir=stage.wdir,
                    upstream=tuple(address(up) for up in graph.successors(stage) if up.cmd),
                    gpu=bool(meta.get("gpu", False)),
                    retries=int(meta.get("retries", 0)),
                )
    except DvcException as exc:
        raise PipelineError(f"{repo_dir}: DVC cannot read the pipeline: {exc}") from None
    return nodes


def select(nodes: Mapping[str, StageNode], targets: Sequence[str] | None) -> dict[str, StageNode]:
    """The targets (a stage, or a foreach/matrix group such as `pretrain`) and everything upstream."""
    if not targets:
        return dict(nodes)
    wanted: set[str] = set()
    for target in targets:
        found = [name for name in nodes if name == target or name.split("@")[0] == target]
        if not found:
            raise PipelineError(f"target '{target}' is not a stage of dvc.yaml (stages: {', '.join(nodes)})")
        wanted.update(found)
    queue = list(wanted)
    while queue:
        for up in nodes[queue.pop()].upstream:
            if up not in wanted:
                wanted.add(up)
                queue.append(up)
    return {name: node for name, node in nodes.items() if name in wanted}


def visible_gpus() -> list[str]:
    """The GPU ids a stage may be given (CUDA_VISIBLE_DEVICES when set, else what torch sees)."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices is not None:  # set: it decides, "" is none
        return [d.strip() for d in devices.split(",") if d.strip() and d.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def changed(repo_dir: Path, names: Sequence[str]) -> set[str]:
    """The stages among `names` that `dvc repro` would run now."""
    if not names:
        return set()
    result = dvc(repo_dir, "status", "--json", *names)
    if result.returncode != 0:
        raise PipelineError(f"dvc status failed: {last_line(result.stderr or result.stdout)}")
    return set(json.loads(result.stdout or "{}")) & set(names)


@dataclass(frozen=True)
class StageResult:
    name: str
    ran: bool
    seconds: float
    where: str = ""  # for a dispatched stage: its attempts on the pool


UP_TO_DATE = "up to date: dvc status reports no change"


def cached(result: StageResult) -> State:
    """A stage that did not need to run, in Prefect's Cached state: the UI shows the whole graph."""
    return Completed(name="Cached", message=UP_TO_DATE, data=result)


@task(task_run_name="{name}")
def up_to_date(name: str) -> State:
    return cached(StageResult(name, False, 0.0))


@task(task_run_name="{name}")
def not_run(name: str, failed: str) -> State:
    return Cancelled(name="NotRun", message=f"not run: upstream {failed} failed")


@task(task_run_name="{node.name}")
def run_stage(repo_dir: Path, node: StageNode, recheck: bool, env: Mapping[str, str]) -> StageResult | State:
    """`dvc repro -s <stage>`: skip if up to date, else its command, then its outputs into DVC."""
    logger = get_run_logger()
    started = time.perf_counter()
    if recheck and node.name not in changed(repo_dir, [node.name]):
        return cached(StageResult(node.name, False, time.perf_counter() - started))
    for cmd in node.cmds:
        logger.info("%s: %s", node.name, cmd)
        result = subprocess.run(
            cmd, shell=True, cwd=node.wdir, env=stage_env(env), capture_output=True, text=True
        )
        output = (result.stdout + result.stderr).strip().splitlines()
        if output:
            logger.info("%s output (last lines):\n%s", node.name, "\n".join(output[-_TAIL_LINES:]))
        if result.returncode != 0:
            raise RuntimeError(f"exit {result.returncode}: {last_line(result.stderr or result.stdout)}")
    committed = dvc(repo_dir, "commit", "--force", node.name)
    if committed.returncode != 0:
        raise RuntimeError(f"dvc commit failed: {last_line(committed.stderr or committed.stdout)}")
    return StageResult(node.name, True, time.perf_counter() - started)


@task(task_run_name="{node.name} on the pool")
def run_stage_on_pool(
    repo_dir: Path,
    node: StageNode,
    recheck: bool,
    env: Mapping[str, str],
    target: Target,
    overrides: list[str],
) -> StageResult | State:
    """The stage as a flow run on any worker of the pool (run again after a crash, `meta.retries`
    times at most); back here through the remotes: `dvc repro` restores it from the run cache the
    worker pushed, so dvc.lock records it as if it had run here."""
    started = time.perf_counter()
    if recheck and node.name not in changed(repo_dir, [node.name]):
        return cached(StageResult(node.name, False, time.perf_counter() - started))
    remote = target.dvc_remote_args()
    dvc_checked(repo_dir, "push", "--run-cache", *remote, *node.upstream)  # what the worker needs
    parent_run_id = env.get(PARENT_RUN_ENV) or os.environ.get(PARENT_RUN_ENV, "")
    experiment = re.sub(r"[^A-Za-z0-9_.-]", ".", f"stage-{parent_run_id[:8]}-{node.name}")
    parameters = {
        "stage": node.name,
        "experiment": experiment,
        "overrides": overrides,
        "revision": target.revision,
        "parent_run_id": parent_run_id,
        "tracking_uri": target.tracking_uri,
        "git_remote": target.git_remote,
        "dvc_remote": target.dvc_remote,
    }
    attempts = dispatch(target, "pipeline-stage", parameters, experiment, node.retries)
    dvc_checked(repo_dir, "exp", "pull", "--force", "--run-cache", *remote, target.git_remote, experiment)
    dry = dvc_checked(repo_dir, "repro", "--single-item", "--dry", node.name)
    if "is cached - skipping run" not in dry:  # never run a GPU stage here by mistake
        raise RuntimeError(
            f"the run cache from {attempts[-1].worker} does not match this workspace's {node.name}"
        )
    dvc_checked(repo_dir, "repro", "--single-item", node.name)
    where = "; then ".join(a.line() for a in attempts)
    return StageResult(node.name, True, time.perf_counter() - started, where)


def schedule(
    repo_dir: Path,
    nodes: Mapping[str, StageNode],
    max_parallel: int,
    gpu_slots: int,
    retry_delay_s: float,
    env: Mapping[str, str],
    gpus: Sequence[str] = (),
    target: Target | None = None,
    overrides: Sequence[str] = (),
) -> Summary:
    """Submit each stage once all its upstream succeeded; never more than the slots allow. A GPU
    stage gets a GPU of its own (CUDA_VISIBLE_DEVICES) while there are as many slots as GPUs; with a
    pool `target`, it is dispatched there instead (with `overrides`), and `max_parallel` counts only
    the stages that run here. Stages at once share the cores (OMP_NUM_THREADS, unless the user set it);
    without GPUs a training stage (`meta.gpu`) runs alone among them and gets every core."""
    shared = {**env, **threads_each(max_parallel)}
    logger = get_run_logger()
    summary = Summary()
    stale = changed(repo_dir, list(nodes))  # one status call; later only downstream of a run stage
    done: dict[str, bool] = {}  # stage -> ran
    started: dict[str, float] = {}
    running: dict[Any, StageNode] = {}
    free_gpus = [gpus[i % len(gpus)] for i in range(gpu_slots)] if gpus else []
    gpu_of: dict[Any, str] = {}
    pending = list(nodes)
    while pending or running:
        for name in list(pending):
            node = nodes[name]
            failed = [up for up in node.upstream if up in summary.failed or up in summary.not_run]
            if failed:
                pending.remove(name)
                summary.not_run.append(name)
                not_run(name, failed[0], return_state=True)  # a task run all the same, for the UI
                continue
            if not all(up in done for up in node.upstream if up in nodes):
                continue
            upstream_ran = any(done.get(up) for up in node.upstream)
            if not upstream_ran and name not in stale:
                pending.remove(name)
                done[name] = False
                summary.skipped.append(name)
                summary.seconds[name] = 0.0
                up_to_date(name, return_state=True)
                continue
            dispatched = target is not None and node.gpu
            gpu_busy = sum(n.gpu for n in running.values())
            here_busy = sum(not (target is not None and n.gpu) for n in running.values())
            if (not dispatched and here_busy >= max_parallel) or (node.gpu and gpu_busy >= gpu_slots):
                continue
            if dispatched:
                pending.remove(name)
                started[name] = time.perf_counter()
                task_run = run_stage_on_pool.with_options(tags=["gpu"])
                running[
                    task_run.submit(repo_dir, node, name not in stale, shared, target, list(overrides))
                ] = node
                continue
            options: dict[str, Any] = {"tags": ["gpu"] if node.gpu else ["cpu"]}
            if node.retries:
                options["retries"] = node.retries
                options["retry_delay_seconds"] = exponential_backoff(retry_delay_s)(node.retries)
            pending.remove(name)
            started[name] = time.perf_counter()
            device = free_gpus.pop(0) if node.gpu and free_gpus else None
            if device is not None:
                on_device = {**shared, "CUDA_VISIBLE_DEVICES": device}
            else:
                on_device = env if node.gpu and not gpus else shared
            future = run_stage.with_options(**options).submit(repo_dir, node, name not in stale, on_device)
            running[future] = node
            if device is not None:
                gpu_of[future] = device
        if not running:
            continue
        finished = next(as_completed(list(running)))
        node = running.pop(finished)
        if finished in gpu_of:
            free_gpus.append(gpu_of.pop(finished))
        summary.seconds[node.name] = time.perf_counter() - started[node.name]
        result = finished.result(raise_on_failure=False)  # the final state, after any retries
        if isinstance(result, StageResult):
            done[node.name] = result.ran
            (summary.ran if result.ran else summary.skipped).append(node.name)
            if result.where:
                summary.where[node.name] = result.where
        else:
            summary.failed[node.name] = str(result)
            logger.error("stage %s failed: %s", node.name, result)
    return summary


@flow(name="pipeline", log_prints=True)
def pipeline(
    repo: str = ".",
    targets: list[str] | None = None,
    overrides: list[str] | None = None,
    max_parallel: int | None = None,
    gpu_slots: int | None = None,
    retry_delay_s: float = 10.0,
    dvc_remote: str | None = None,
    pool: str | None = None,
    git_remote: str = "origin",
) -> dict[str, Any]:
    """Bring the DVC pipeline (or `targets` and their upstream) up to date; return the summary.

    max_parallel: stages at once; by default one per visible GPU, and one without GPUs (a stage
    uses every core: two at once on the same cores are slower than one after the other).
    gpu_slots: how many stages with `meta.gpu` run at once, each on a GPU of its own; by default
    one per visible GPU, and one without GPUs: a training stage on the CPU takes every core (as many
    threads as its params say, whatever the flow runs beside it, since the thread count changes the
    float bits; a fine-tune stage runs its jobs in as many processes as the cores hold).
    dvc_remote: a DVC remote shared by the workers: what it has is pulled first (outputs another
    machine produced), the outputs of every stage that ran are pushed to it at the end.

    overrides: params as `dvc exp run -S` takes them (`objectives.mlm.mask_rate=0.2`), written
    into params.yaml first, after those of LMPIPE_PARAMS_OVERRIDES (a work pool's device settings).

    pool: the stages with `meta.gpu` become flow runs of the deployment `pipeline-stage-<pool>` on
    any worker of that work pool (flows/dispatch.py), at the committed and pushed HEAD with this
    workspace's params; their results come back through `git_remote` and the DVC remote (`dvc_remote`,
    else the project's default); the pool's device settings (its deployment's job variables) are
    written into params.yaml here as well, so that DVC sees the same params on both sides.
    `gpu_slots` then caps the stages in flight on the pool (default: all of them).
    A failed stage fails the flow; stages downstream of it do not run.
    """
    gpus = visible_gpus()
    if max_parallel is None:
        max_parallel = max(1, len(gpus))
    logger = get_run_logger()
    repo_dir = Path(repo).resolve()
    nodes = select(read_graph(repo_dir), targets)
    if gpu_slots is None:
        gpu_slots = sum(node.gpu for node in nodes.values()) if pool else len(gpus) or 1
    if max_parallel < 1 or gpu_slots < 1:
        raise PipelineError("max_parallel and gpu_slots must be at least 1")
    target = None
    if pool:  # checked before params.yaml changes: the workers get its changes as overrides
        target = pool_target(repo_dir, pool, "pipeline-stage", tracking_uri(repo_dir), git_remote, dvc_remote)
        overrides = target.overrides(overrides or [])
    else:
        overrides = [*pool_overrides(overrides or []), *(overrides or [])]
    apply_overrides(repo_dir, overrides)
    logger.info("%d stages from %s/dvc.yaml", len(nodes), repo_dir)
    with _parent_run(repo_dir, targets, overrides) as env:
        if dvc_remote:
            pulled = dvc(repo_dir, "pull", "--allow-missing", "--remote", dvc_remote, *nodes)
            if pulled.returncode != 0:
                raise PipelineError(f"dvc pull from '{dvc_remote}' failed: {last_line(pulled.stderr)}")
        summary = schedule(
            repo_dir, nodes, max_parallel, gpu_slots, retry_delay_s, env, gpus, target, overrides
        )
        if dvc_remote and summary.ran:
            pushed = dvc(repo_dir, "push", "--remote", dvc_remote, *summary.ran)
            if pushed.returncode != 0:
                raise PipelineError(f"dvc push to '{dvc_remote}' failed: {last_line(pushed.stderr)}")
    logger.info("pipeline: %s\n%s", summary.line(), summary.markdown())
    create_markdown_artifact(summary.markdown(), key="pipeline-summary", description=summary.line())
    if summary.failed:
        raise StageFailed(summary)
    return asdict(summary)


class _parent_run:
    """An MLflow run the stage runs of this execution nest under (unless a parent is already set)."""

    def __init__(self, repo_dir: Path, targets: Sequence[str] | None, overrides: Sequence[str] | None):
        self.repo_dir, self.targets, self.overrides = repo_dir, targets, overrides
        self.run_id: str | None = None

    def __enter__(self) -> dict[str, str]:
        if os.environ.get(PARENT_RUN_ENV):
            return {}
        from lmpipe.tracking import git_commit

        experiment = tracking_experiment(self.repo_dir / PARAMS_FILE)
        self.tracking = FlowTracking(self.repo_dir, experiment)
        tags = {"stage": "pipeline", "git_commit": git_commit(), "targets": ",".join(self.targets or [])}
        tags.update({f"override.{o.partition('=')[0]}": o.partition("=")[2] for o in self.overrides or []})
        self.run_id = self.tracking.start("pipeline", tags)
        return child_env(self.run_id, self.tracking.uri)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.run_id is not None:
            self.tracking.client.set_terminated(self.run_id, "FAILED" if exc_type else "FINISHED")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", default=".", help="the DVC project (default: here)")
    parser.add_argument("--target", action="append", dest="targets", help="a stage or group; repeatable")
    parser.add_argument("-S", "--set", action="append", dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--max-parallel", type=int, help="stages at once (default: GPUs seen, or 1)")
    parser.add_argument(
        "--gpu-slots", type=int, help="stages with meta.gpu at once (default: GPUs seen, 1 without)"
    )
    parser.add_argument("--dvc-remote", help="a DVC remote to pull from first and push to at the end")
    parser.add_argument("--pool", help="run the stages with meta.gpu as flow runs on this Prefect work pool")
    parser.add_argument("--git-remote", default="origin", help="with --pool: the git remote (default origin)")
    args = parser.parse_args(argv)

    def body() -> str:
        repo_dir = Path(args.repo).resolve()  # bad input is one line before any flow starts
        check_overrides(repo_dir, args.overrides or [])
        select(read_graph(repo_dir), args.targets)
        summary = pipeline(
            repo=args.repo,
            targets=args.targets,
            overrides=args.overrides,
            max_parallel=args.max_parallel,
            gpu_slots=args.gpu_slots,
            dvc_remote=args.dvc_remote,
            pool=args.pool,
            git_remote=args.git_remote,
        )
        return Summary(**summary).line()

    return cli(body)


if __name__ == "__main__":
    sys.exit(main())
