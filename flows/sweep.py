"""What every sweep shares (flows/ablation.py, flows/scaling.py): its options and command line, its
name, its points as DVC experiments (run here or on a work pool), its MLflow parent run with a child
per point, and its report published.

Each point runs as `dvc exp run --temp --name <sweep>-<i> -S key=value ...`: in its own temporary
copy of the workspace (DVC releases its repository lock while the experiment runs), so up to
`max_parallel` points run at once without touching each other's outputs or the workspace. Stages a
point does not change are skipped as DVC always does.

A sweep's options are its flow's signature: each parameter's type carries its help
(`Annotated[..., Option(...)]`), and `command_line` builds the command line from it, so the flow
parameters of the Prefect UI and the command line's flags are one definition.
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import io
import json
import sys
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import as_completed

from flows import profile as profiles
from flows.common import (
    EXPERIMENT_NAME,
    FlowFailed,
    PipelineError,
    check_overrides,
    cli,
    drop_finished_run,
    dvc,
    error_line,
    exp_run,
    hydra_value,
    last_line,
    pool_overrides,
    replacing,
    stages_ran,
    threads_each,
)
from flows.dispatch import DISPATCH_TAG, Target, dispatch, pool_target
from flows.pipeline import read_graph, visible_gpus
from lmpipe.layout import GLUE_METRICS, PREDICTIONS, pretrain_context, pretrain_curve, pretrain_metrics
from lmpipe.params.project import Params
from lmpipe.params.schema import PARAMS_FILE
from lmpipe.tracking import FlowTracking, child_env, git_commit, tracking_experiment

MODELS_KEY = "models"  # a point's key of its own: which model variants of params.yaml it trains
REPORTS = Path("reports") / "ablation"  # a sweep's report: reports/ablation/<sweep>/


# --- options: the flow's signature is its command line -------------------------------------------


@dataclass(frozen=True)
class Option:
    """A flow parameter's command-line form: its help; JSON when its value is a list or a mapping."""

    help: str
    positional: bool = False


Repo = Annotated[str, Option("the DVC project (default: here)")]
MaxParallel = Annotated[
    int | None,
    Option("points at once (default: 2 with GPUs or a pool; 1 on a CPU, where a point trains on every core)"),
]
SweepName = Annotated[str | None, Option("the sweep's name (default: its kind and the UTC time)")]
Profile = Annotated[str | None, Option(f"run on a params profile ({', '.join(profiles.available())})")]
Corpus = Annotated[str | None, Option("the profile's text folder")]
Glue = Annotated[str | None, Option("the profile's GLUE folder")]
Pool = Annotated[str | None, Option("run every point as a flow run on this Prefect work pool")]
DvcRemote = Annotated[str | None, Option("with --pool: the DVC remote (default: the project's default)")]
GitRemote = Annotated[str, Option("with --pool: the git remote (default origin)")]
SetParams = Annotated[
    dict[str, Any] | None,
    Option(
        "JSON: params values every point starts from, on top of the profile's (as dvc exp run -S), e.g. "
        '{"models.encdec_span.pretrain.max_steps": 1000}'
    ),
]


def _option_type(annotation: Any) -> tuple[Any, Option]:
    """(the value's type without None, its Option) of an `Annotated[..., Option]` parameter."""
    base, option = annotation, None
    if typing.get_origin(annotation) is Annotated:
        base, *extras = typing.get_args(annotation)
        option = next((e for e in extras if isinstance(e, Option)), None)
    if option is None:
        raise TypeError(f"{annotation}: a sweep parameter's type is Annotated[..., Option(help)]")
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        base = next(arg for arg in typing.get_args(base) if arg is not type(None))
    return base, option


def command_line(
    flow_fn: Any,
    argv: Sequence[str] | None,
    check: Callable[[dict[str, Any]], None],
    summary: Callable[[dict[str, Any]], str],
    plan: Callable[[dict[str, Any]], str] | None = None,
) -> int:
    """Parse `argv` into `flow_fn`'s parameters (`--max-parallel` for `max_parallel`; JSON for lists
    and mappings), `check` them (bad input is one line before any flow starts), run the flow and print
    `summary` of its result; with `plan`, `--plan` prints what `plan` says of the arguments instead and
    starts no flow."""
    function = getattr(flow_fn, "fn", flow_fn)  # a Prefect flow wraps the function
    hints = typing.get_type_hints(function, include_extras=True)
    module = sys.modules[function.__module__]
    module_name = module.__spec__.name if module.__spec__ else function.__module__  # not __main__ under -m
    summary_line = " ".join((module.__doc__ or "").split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog=f"python -m {module_name}", description=summary_line)
    given_as_json = []
    for name, parameter in inspect.signature(function).parameters.items():
        base, option = _option_type(hints[name])
        as_json = (typing.get_origin(base) or base) in (list, dict, tuple, Sequence, Mapping)
        given_as_json += [name] if as_json else []
        kind = str if as_json else base
        if option.positional:
            parser.add_argument(name, nargs="?", type=kind, default=parameter.default, help=option.help)
        else:
            flag = "--" + name.replace("_", "-")
            parser.add_argument(flag, dest=name, type=kind, default=parameter.default, help=option.help)
    if plan is not None:
        parser.add_argument(
            "--plan", action="store_true", help="print what would run and its cost; run nothing"
        )
    arguments = vars(parser.parse_args(argv))
    planning = bool(arguments.pop("plan", False))

    def body() -> str:
        for name in given_as_json:
            if isinstance(arguments[name], str):
                try:
                    arguments[name] = json.loads(arguments[name])
                except json.JSONDecodeError as exc:
                    raise PipelineError(f"--{name.replace('_', '-')} is not JSON: {exc}") from None
        check(arguments)
        if planning and plan is not None:
            return plan(arguments)
        return summary(flow_fn(**arguments))

    return cli(body)


# --- points --------------------------------------------------------------------------------------


def model_of(key: str) -> str | None:
    """The model a `models.<name>.…` or `finetune.models.<name>.…` key belongs to, if any."""
    parts = key.lstrip("+~").split(".")
    if parts[0] == MODELS_KEY and len(parts) > 1:
        return parts[1]
    if parts[:2] == ["finetune", MODELS_KEY] and len(parts) > 2:
        return parts[2]
    return None


def defined_models(
    chosen: Mapping[str, Any], params: Mapping[str, Any], params_file: Path
) -> dict[str, dict[str, Any]]:
    """A point's own models, `{name: {"from": <a model of params>, <key>: <value>, ...}}`: each the
    named model's fields with the given ones changed (T5's table: one model, its architecture and
    objective varied, at the profile's size)."""
    known = params.get(MODELS_KEY) or {}
    models = {}
    for name, spec in chosen.items():
        base = spec.get("from") if isinstance(spec, Mapping) else None
        if base not in known:
            raise PipelineError(
                f"grid key 'models.{name}': give {{\"from\": <a model of {params_file.name}>, <key>: "
                f"<value>, ...}}; the models are {list(known)}"
            )
        models[name] = {**known[base], **{key: value for key, value in spec.items() if key != "from"}}
    return models


def point_overrides(
    point: Mapping[str, Any], params: Mapping[str, Any], params_file: Path, origin: str | None = None
) -> list[str]:
    """A point as DVC's -S overrides; `models` keeps only the named variants (the rest are deleted),
    or defines the point's own (`defined_models`: each with the fine-tuning values of the model it is
    made from). `params`: what the point starts from (params.yaml, a profile applied: `origin` names it)."""
    known = list(params.get(MODELS_KEY) or {})
    chosen = point.get(MODELS_KEY, known)
    defined = defined_models(chosen, params, params_file) if isinstance(chosen, Mapping) else {}
    keep = list(defined) if defined else [chosen] if isinstance(chosen, str) else list(chosen)
    own_recipes = (params.get("finetune") or {}).get("models") or {}
    overrides = []
    for key, value in point.items():
        if key == MODELS_KEY:
            unknown = [name for name in keep if name not in known and name not in defined]
            if unknown:
                raise PipelineError(
                    f"grid key 'models': {params_file} has no model {unknown[0]!r} (has {known})"
                )
            dropped = [name for name in known if name not in keep]
            # a dropped model's own fine-tuning values go with it (finetune.models names only models)
            overrides += [f"~models.{name}" for name in dropped]
            overrides += [f"~finetune.models.{name}" for name in dropped if name in own_recipes]
            for name, fields in defined.items():
                overrides += putting(f"models.{name}", fields, name in known)
                recipe = own_recipes.get(chosen[name]["from"])
                if recipe:
                    overrides += putting(f"finetune.models.{name}", recipe, name in own_recipes)
                elif name in own_recipes:
                    overrides.append(f"~finetune.models.{name}")
        else:
            owner = model_of(key)
            if owner in known and owner not in keep:  # its values go with the deleted model
                raise PipelineError(f"grid key '{key}': the point does not train {owner} (models: {keep})")
            overrides += setting(key, value, params)
    trained = {**params, MODELS_KEY: {**(params.get(MODELS_KEY) or {}), **defined}}
    check_not_shadowed(point, keep, trained, origin or str(params_file))
    overrides = [*pool_overrides(overrides), *overrides]
    check_overrides(params_file.parent, overrides, params, origin)
    return overrides


def putting(key: str, value: Any, present: bool) -> list[str]:
    """`key: value` as -S overrides, replacing what is at `key` if `present` (DVC deletes only a key
    that is there)."""
    return replacing(key, value) if present else [f"++{key}={hydra_value(value)}"]


def setting(key: str, value: Any, params: Mapping[str, Any]) -> list[str]:
    """`key: value` as DVC's -S overrides; a mapping replaces the mapping that `params` has at `key`."""
    bare, node = params_key(key), params
    for part in bare.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(value, Mapping) and isinstance(node, Mapping):
        return replacing(bare, value)
    return [f"{key}={hydra_value(value)}"]


def check_not_shadowed(
    point: Mapping[str, Any], trained: Sequence[str], params: Mapping[str, Any], origin: str
) -> None:
    """A `pretrain.<key>` of the point must reach every model it trains: one whose own
    `models.<name>.pretrain` sets that key would train unchanged, and the sweep would read a row of
    noise as the key's effect."""
    models = params.get(MODELS_KEY) or {}
    keys = [params_key(key) for key in point]
    for key in point:
        section, _, field = params_key(key).partition(".")
        if section != "pretrain" or not field:
            continue
        field = field.split(".")[0]
        for name in trained:
            own = (models.get(name) or {}).get("pretrain") or {}
            if field in own and not any(k.startswith(f"models.{name}.pretrain") for k in keys):
                raise PipelineError(
                    f"grid key '{key}': {origin} sets models.{name}.pretrain.{field} ({own[field]}), "
                    f"which wins for {name}: sweep 'models.{name}.pretrain.{field}' too, or leave "
                    f"{name} out of the point"
                )


def text(value: Any) -> str:
    """A point's value as its MLflow param, tag and table cell show it (a point's own models: their
    names)."""
    return ",".join(map(str, value)) if isinstance(value, list | Mapping) else str(value)


def params_key(key: str) -> str:
    """The dotted params key a grid key sets: `++key` adds a key params.yaml lacks, the same key."""
    return key.lstrip("+")


def point_params(point: Mapping[str, Any]) -> dict[str, str]:
    """A point's values as its MLflow params, by params key (MLflow refuses a `+` in a name)."""
    return {params_key(key): text(value) for key, value in point.items()}


@dataclass(frozen=True)
class Point:
    index: int
    experiment: str  # the DVC experiment's name
    values: dict[str, Any]
    overrides: list[str]
    run_id: str  # its MLflow run, parent of its stage runs
    targets: tuple[str, ...] = ()  # the stages to run (pretrain@<model>: a scaling point); all if empty


class PointsFailed(FlowFailed):
    def __init__(self, failed: Mapping[int, str]) -> None:
        super().__init__(f"{len(failed)} point(s) failed: " + "; ".join(failed.values()))
        self.failed = dict(failed)


@task(task_run_name="{point.experiment}")
def run_point(repo_dir: Path, point: Point, tracking_uri: str, at_once: int) -> dict[str, Any]:
    """The point as a DVC experiment in a temporary workspace, its stages on its share of the cores
    (`at_once` points run at once); its metrics and loss curves back."""
    logger = get_run_logger()
    arguments = exp_run(point.experiment, point.overrides, point.targets)
    logger.info("dvc %s", " ".join(arguments))
    started = time.perf_counter()
    result = dvc(repo_dir, *arguments, env={**child_env(point.run_id, tracking_uri), **threads_each(at_once)})
    ran = stages_ran(result.stdout + result.stderr)
    logger.info("%s: ran %s", point.experiment, ", ".join(ran) or "nothing (all cached)")
    if result.returncode != 0:
        raise RuntimeError(f"{point.experiment}: {error_line(result.stderr or result.stdout)}")
    return {**outputs(repo_dir, point), "seconds": time.perf_counter() - started}


@task(task_run_name="{point.experiment} on the pool")
def run_point_on_pool(repo_dir: Path, point: Point, target: Target, retries: int) -> dict[str, Any]:
    """The point as a flow run on any worker of the pool (run again after a crash, `retries` times at
    most); its experiment and outputs back through the git and DVC remotes."""
    started = time.perf_counter()
    parameters = {
        "experiment": point.experiment,
        "overrides": point.overrides,
        "revision": target.revision,
        "parent_run_id": point.run_id,
        "tracking_uri": target.tracking_uri,
        "git_remote": target.git_remote,
        "dvc_remote": target.dvc_remote,
        "targets": list(point.targets),
    }
    attempts = dispatch(target, "ablation-point", parameters, point.experiment, retries)
    pulled = dvc(
        repo_dir, "exp", "pull", "--force", *target.dvc_remote_args(), target.git_remote, point.experiment
    )
    if pulled.returncode != 0:
        raise RuntimeError(f"{point.experiment}: dvc exp pull: {last_line(pulled.stderr or pulled.stdout)}")
    return {**outputs(repo_dir, point), "seconds": time.perf_counter() - started, "attempts": attempts}


def outputs(repo_dir: Path, point: Point) -> dict[str, Any]:
    """A point's pretraining metrics, loss curves and losses by context length and, when it ran the
    whole graph, its GLUE metrics and predictions: from the DVC cache through the experiment's commit."""
    experiment = point.experiment
    glue = None if point.targets else json.loads(_read(repo_dir, GLUE_METRICS, experiment))
    models = [t.split("@", 1)[1] for t in point.targets if t.startswith("pretrain@")] or list(glue or {})
    curves = {m: pd.read_csv(io.StringIO(_read(repo_dir, pretrain_curve(m), experiment))) for m in models}
    pretrain = {model: json.loads(_read(repo_dir, pretrain_metrics(model), experiment)) for model in models}
    contexts = {m: pd.read_csv(io.StringIO(_read(repo_dir, pretrain_context(m), experiment))) for m in models}
    found = {"curves": curves, "pretrain": pretrain, "contexts": contexts}
    if glue is None:
        return found
    predictions = pd.read_parquet(io.BytesIO(_read(repo_dir, PREDICTIONS, experiment, "rb")))
    return found | {"glue": glue, "predictions": predictions}


def _read(repo_dir: Path, path: Path, experiment: str, mode: str = "r") -> Any:
    import dvc.api

    return dvc.api.read(path.as_posix(), repo=str(repo_dir), rev=experiment, mode=mode)


def points_at_once(max_parallel: int | None, pool: str | None) -> int:
    """`--max-parallel`, by default 2 with GPUs or a pool and 1 on a CPU-only machine: there a point's
    training uses every core (`pretrain.threads`, which a sweep does not change, since the thread
    count changes the float bits), and two at once would each run slower than alone."""
    if max_parallel is not None:
        return max_parallel
    return 2 if pool or visible_gpus() else 1


# --- the sweep -----------------------------------------------------------------------------------


def set_overrides(set_params: Mapping[str, Any] | None) -> list[str]:
    """`--set-params` as overrides: each dotted key set (or added) to its value."""
    return [f"++{key}={hydra_value(value)}" for key, value in (set_params or {}).items()]


class Sweep:
    """One sweep from its options to its report: `plan` its points on the project's params (a profile
    applied), `start` its MLflow parent and a child per point, `run` the points, `publish` the report,
    `close`."""

    def __init__(
        self,
        kind: str,
        repo: str,
        name: str | None,
        max_parallel: int,
        profile: str | None = None,
        corpus: str | None = None,
        glue: str | None = None,
        prefix: str | None = None,
        set_params: Mapping[str, Any] | None = None,
    ) -> None:
        self.kind = kind  # its MLflow parent's `stage` tag
        self.repo_dir = Path(repo).resolve()
        self.name = name or f"{prefix or kind}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
        if not EXPERIMENT_NAME.match(self.name):
            raise PipelineError(f"sweep name '{self.name}': letters, digits, '-', '_' and '.' only")
        if max_parallel < 1:
            raise PipelineError("max_parallel must be at least 1")
        self.max_parallel = max_parallel
        self.params_file = self.repo_dir / PARAMS_FILE
        self.on_profile = [
            *(profiles.overrides(profile, corpus, glue) if profile else []),
            *set_overrides(set_params),
        ]
        self.origin = f"profile {profile}" if profile else str(self.params_file)
        if set_params:
            self.origin += " with --set-params"
        self.params = profiles.applied(self.repo_dir, self.on_profile, self.origin)  # as a point starts
        self.out = self.repo_dir / REPORTS / self.name
        self.tracking: FlowTracking | None = None
        self.target: Target | None = None
        self.parent = ""

    def overrides(self, point: Mapping[str, Any]) -> list[str]:
        """A point's overrides on the profile's."""
        return [*self.on_profile, *point_overrides(point, self.params, self.params_file, self.origin)]

    def validate(self, overrides: Sequence[str]) -> Params:
        """A point's params as its stages will read them; a bad key or value is one line."""
        return profiles.validate(self.repo_dir, overrides, self.origin)

    def start(
        self,
        planned: Sequence[tuple[dict[str, Any], list[str], dict[str, Any]]],
        tags: Mapping[str, Any],
        metrics: Mapping[str, float],
        params: Mapping[str, Any],
        pool: str | None,
        git_remote: str,
        dvc_remote: str | None,
        targets: tuple[str, ...] = (),
    ) -> list[Point]:
        """The sweep's MLflow parent (and with a `pool`, its target, checked and pushed to), and a
        child run per planned point: (its values, its overrides, its tags)."""
        self.tracking = FlowTracking(self.repo_dir, tracking_experiment(self.params_file))
        if pool:
            self.target = pool_target(
                self.repo_dir, pool, "ablation-point", self.tracking.uri, git_remote, dvc_remote
            )
            # a point's unchanged stages come from the remote: the workspace's outputs and run cache
            pushed = dvc(self.repo_dir, "push", "--run-cache", *self.target.dvc_remote_args())
            if pushed.returncode != 0:
                raise PipelineError(f"dvc push: {last_line(pushed.stderr or pushed.stdout)}")
        if stopped := self.tracking.end_stopped({"sweep": self.name}):
            message = "%s: %d runs of an earlier, stopped run of it marked KILLED"
            get_run_logger().info(message, self.name, stopped)
        if orphaned := self.tracking.end_orphaned():
            get_run_logger().info("%d runs of flows whose process has gone marked KILLED", orphaned)
        self.parent = self.tracking.start(
            self.name, {"stage": self.kind, "sweep": self.name, **tags, "git_commit": git_commit()}
        )
        self.tracking.log(self.parent, {"points": len(planned), **metrics}, params)
        points = []
        for index, (values, overrides, point_tags) in enumerate(planned, start=1):
            experiment = f"{self.name}-{index}"
            # a point an earlier run of this sweep finished (a pool's points are pulled with --force)
            if not pool and drop_finished_run(self.repo_dir, experiment):
                get_run_logger().info("%s: finished by an earlier run; again from the run cache", experiment)
            child_tags = {"stage": "ablation_point", "sweep": self.name, "dvc_experiment": experiment}
            child_tags |= {"point": index, **point_tags}
            run_id = self.tracking.start(experiment, child_tags, parent=self.parent)
            if self.target is not None:
                overrides = self.target.overrides(overrides)
            points.append(Point(index, experiment, values, overrides, run_id, targets))
        return points

    def run(self, points: Sequence[Point]) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        """Every point, `max_parallel` at once; (the results by point, the failures by point)."""
        assert self.tracking is not None, "start the sweep first"
        logger = get_run_logger()
        # on a pool, a crashed point runs again as often as the graph's most patient stage (meta.retries)
        retries = 0
        if self.target is not None:
            retries = max((node.retries for node in read_graph(self.repo_dir).values()), default=0)
        results: dict[int, dict[str, Any]] = {}
        failed: dict[int, str] = {}
        waiting = list(points)
        running: dict[Any, Point] = {}
        while waiting or running:
            while waiting and len(running) < self.max_parallel:
                point = waiting.pop(0)
                future = (
                    run_point_on_pool.submit(self.repo_dir, point, self.target, retries)
                    if self.target is not None
                    else run_point.submit(self.repo_dir, point, self.tracking.uri, self.max_parallel)
                )
                running[future] = point
            finished = next(as_completed(list(running)))
            point = running.pop(finished)
            outcome = finished.result(raise_on_failure=False)
            if isinstance(outcome, dict):
                results[point.index] = outcome
            else:
                failed[point.index] = str(outcome)
                logger.error("point %s failed: %s", point.experiment, outcome)
        return results, failed

    def finish_point(self, point: Point, metrics: Mapping[str, float], params: Mapping[str, Any]) -> None:
        assert self.tracking is not None
        self.tracking.log(point.run_id, metrics, params)
        self.tracking.client.set_terminated(point.run_id, "FINISHED")

    def fail_point(self, point: Point) -> None:
        assert self.tracking is not None
        self.tracking.client.set_terminated(point.run_id, "FAILED")

    def publish(self, files: Mapping[str, bytes | str], report: str, artifact_key: str) -> None:
        """`files` into reports/ablation/<sweep>/ and onto the parent run; the markdown one named
        `report` also as a Prefect artifact."""
        assert self.tracking is not None
        self.out.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            path = self.out / name
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        for path in sorted(self.out.iterdir()):
            self.tracking.client.log_artifact(self.parent, str(path))
        create_markdown_artifact(str(files[report]), key=artifact_key)

    def where_points_ran(
        self, points: Sequence[Point], results: Mapping[int, dict[str, Any]], failed: Mapping[int, str]
    ) -> str:
        """With a pool: each point's attempts (worker and outcome) and how long it waited between submit
        and its first stage; else nothing."""
        if self.target is None:
            return ""
        assert self.tracking is not None
        lines = ["", f"Points ran on work pool `{self.target.pool}` at commit `{self.target.revision[:12]}`:"]
        lines += ["", "| experiment | attempts | submit → first stage (s) |", "|---|---|---:|"]
        for point in points:
            tags = self.tracking.client.get_run(point.run_id).data.tags
            if point.index in results:
                attempts = "; then ".join(a.line() for a in results[point.index]["attempts"])
            else:
                attempts = failed[point.index].split(": ", 1)[-1]
            lines.append(f"| {point.experiment} | {attempts} | {tags.get(DISPATCH_TAG, '—')} |")
        return "\n".join(lines) + "\n"

    def close(self, metrics: Mapping[str, float], failed: Mapping[int, str]) -> None:
        """The parent's own metrics, its end; a failed point fails the flow (after the report)."""
        assert self.tracking is not None
        if metrics:
            self.tracking.log(self.parent, metrics, {})
        self.tracking.client.set_terminated(self.parent, "FAILED" if failed else "FINISHED")
        if failed:
            raise PointsFailed(failed)


def png(fig: Any, plt: Any) -> bytes:
    """A matplotlib figure as PNG bytes without a timestamp (the same plot, the same bytes), closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()
