"""Ablation sweeps: a grid of params, every point a DVC experiment, one comparison at the end.

Each point runs as `dvc exp run --temp --name <sweep>-<i> -S key=value ...`: in its own temporary
copy of the workspace (DVC releases its repository lock while the experiment runs), so up to
`max_parallel` points run at once without touching each other's outputs or the workspace. Stages a
point does not change are skipped as DVC always does (commit a reproduced baseline first and only
what the swept params reach re-runs). MLflow gets one parent run for the sweep, one child per point
tagged with its overridden values, and every stage run of the point nested under that child. The
comparison (markdown, csv, plots) goes to reports/ablation/<sweep>/ and to the parent run.

    python -m flows.ablation masking_rate
    python -m flows.ablation --grid '{"objectives.mlm.mask_rate": [0.1, 0.2], "pretrain.lr": [1e-3, 3e-4]}'
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import as_completed

from flows import profile as profiles
from flows.common import (
    EXPERIMENT_NAME,
    FlowFailed,
    PipelineError,
    check_overrides,
    cli,
    dvc,
    error_line,
    hydra_value,
    last_line,
    pool_overrides,
    stage_env,
)
from flows.dispatch import DISPATCH_TAG, Target, dispatch, pool_target
from flows.pipeline import read_graph
from lmpipe.layout import GLUE_METRICS, PREDICTIONS, pretrain_curve, pretrain_metrics
from lmpipe.params.project import Params
from lmpipe.params.schema import PARAMS_FILE, read_params_yaml
from lmpipe.runtime import StageError
from lmpipe.tracking import FlowTracking, child_env, git_commit, tracking_experiment

MODELS_KEY = "models"  # a grid key of its own: which model variants of params.yaml a point trains
MLM = "objectives.mlm"

# Named after the seeds' tables (../shared/seeds): BERT Table 5 and its 80/10/10 ablation, T5's
# architecture comparison and its corruption-rate table.
PRESETS: dict[str, dict[str, list[Any]] | list[dict[str, Any]]] = {
    "masking_rate": {MODELS_KEY: ["encoder_mlm"], f"{MLM}.mask_rate": [0.10, 0.15, 0.20, 0.25]},
    "mask_split": [  # 100 % [MASK] vs BERT's 80/10/10
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_fraction": 1.0, f"{MLM}.random_fraction": 0.0},
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_fraction": 0.8, f"{MLM}.random_fraction": 0.1},
    ],
    "architecture": {MODELS_KEY: ["encoder_mlm", "decoder_clm", "encdec_span"]},
    "span_density": {MODELS_KEY: ["encdec_span"], "objectives.span.noise_density": [0.10, 0.15, 0.25, 0.50]},
}
# the point every other point of a preset is compared with (BERT's 15 % and 80/10/10, T5's 15 %)
BASELINES: dict[str, dict[str, Any]] = {
    "masking_rate": {f"{MLM}.mask_rate": 0.15},
    "mask_split": {f"{MLM}.mask_fraction": 0.8},
    "architecture": {MODELS_KEY: "encoder_mlm"},
    "span_density": {"objectives.span.noise_density": 0.15},
}
# presets whose points train at equal compute: every point gets the FLOPs the baseline point's model
# spends on its step budget (T5 compares objectives and architectures that way)
EQUAL_FLOPS = {"architecture"}


def expand(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A dict of value lists is their product (in key order); a list of dicts is the points as given."""
    if isinstance(grid, Mapping):
        for key, values in grid.items():
            if isinstance(values, str) or not isinstance(values, Sequence) or not values:
                raise PipelineError(f"grid key '{key}': give a non-empty list of values")
        return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    points = [dict(point) for point in grid]
    if not points or not all(points):
        raise PipelineError("grid: give at least one point, each with at least one key")
    return points


def equal_flops_budget(points: Sequence[Params], base: int) -> tuple[float, str]:
    """The FLOPs every point gets: what the baseline point's one model spends on its step budget; and
    that in words. Every model of every point must afford its warmup on it."""
    from lmpipe.pretraining import planned_train_flops

    baseline = points[base]
    if len(baseline.models) != 1:
        raise PipelineError(f"equal FLOPs: the baseline point trains {len(baseline.models)} models, not one")
    (model,) = baseline.models
    budget = planned_train_flops(baseline, model, baseline.tokenizer.vocab_size)
    steps = baseline.pretrain_of(model).max_steps
    for params in points:
        pretrain = params.pretrain.model_copy(update={"max_flops": budget})
        equal = params.model_copy(update={"pretrain": pretrain})
        for name in params.models:
            try:
                planned_train_flops(equal, name, params.tokenizer.vocab_size)
            except StageError as exc:
                raise PipelineError(f"equal FLOPs: {exc}") from None
    return float(budget), f"{budget:.3g} FLOPs each, what {model} spends on its {steps} steps"


def point_overrides(point: Mapping[str, Any], params: Mapping[str, Any], params_file: Path) -> list[str]:
    """A point as DVC's -S overrides; `models` keeps only the named variants (the rest are deleted,
    with their `pretrain.models.<name>` budgets). `params`: what the point starts from (params.yaml,
    a profile applied)."""
    overrides = []
    for key, value in point.items():
        if key == MODELS_KEY:
            keep = [value] if isinstance(value, str) else list(value)
            known = list(params.get(MODELS_KEY) or {})
            unknown = [name for name in keep if name not in known]
            if unknown:
                raise PipelineError(
                    f"grid key 'models': {params_file} has no model {unknown[0]!r} (has {known})"
                )
            budgets = (params.get("pretrain") or {}).get("models") or {}
            for name in known:
                if name not in keep:
                    overrides.append(f"~models.{name}")
                    if name in budgets:
                        overrides.append(f"~pretrain.models.{name}")
        else:
            overrides.append(f"{key}={hydra_value(value)}")
    overrides = [*pool_overrides(overrides), *overrides]
    check_overrides(params_file.parent, overrides)
    return overrides


def label(point: Mapping[str, Any], swept: Sequence[str]) -> str:
    return ", ".join(f"{key.split('.')[-1]}={_text(point[key])}" for key in swept) or "baseline"


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


@dataclass(frozen=True)
class Point:
    index: int
    experiment: str  # the DVC experiment's name
    values: dict[str, Any]
    overrides: list[str]
    run_id: str  # its MLflow run, parent of its stage runs
    targets: tuple[str, ...] = ()  # the stages to run (pretrain@<model>: a scaling point); all if empty


@task(task_run_name="{point.experiment}")
def run_point(repo_dir: Path, point: Point, tracking_uri: str) -> dict[str, Any]:
    """The point as a DVC experiment in a temporary workspace; its metrics and loss curves back."""
    logger = get_run_logger()
    env = stage_env(child_env(point.run_id, tracking_uri))
    command = ["dvc", "--wait-for-lock", "exp", "run", "--temp", "--name", point.experiment]
    for override in point.overrides:
        command += ["-S", override]
    command += point.targets
    logger.info("%s", " ".join(command))
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", *command], cwd=repo_dir, env=env, capture_output=True, text=True
    )
    ran = re.findall(r"Running stage '([^']+)'", result.stdout + result.stderr)
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
    return {
        **outputs(repo_dir, point),
        "seconds": time.perf_counter() - started,
        "attempts": attempts,
    }


def outputs(repo_dir: Path, point: Point) -> dict[str, Any]:
    """A point's pretraining metrics and loss curves and, when it ran the whole graph, its GLUE metrics
    and predictions: from the DVC cache through the experiment's commit."""
    experiment = point.experiment
    glue = None if point.targets else json.loads(_read(repo_dir, GLUE_METRICS, experiment))
    models = [t.split("@", 1)[1] for t in point.targets if t.startswith("pretrain@")] or list(glue or {})
    curves = {m: pd.read_csv(io.StringIO(_read(repo_dir, pretrain_curve(m), experiment))) for m in models}
    pretrain = {model: json.loads(_read(repo_dir, pretrain_metrics(model), experiment)) for model in models}
    if glue is None:
        return {"curves": curves, "pretrain": pretrain}
    predictions = pd.read_parquet(io.BytesIO(_read(repo_dir, PREDICTIONS, experiment, "rb")))
    return {"glue": glue, "curves": curves, "pretrain": pretrain, "predictions": predictions}


def _read(repo_dir: Path, path: Path, experiment: str, mode: str = "r") -> Any:
    import dvc.api

    return dvc.api.read(path.as_posix(), repo=str(repo_dir), rev=experiment, mode=mode)


def baseline_index(
    values: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any] | None, preset: str | None
) -> int:
    """The 0-based point every other point is compared with: the one matching `baseline` (by default the
    preset's, else the first point)."""
    wanted = baseline if baseline is not None else BASELINES.get(preset or "")
    if not wanted:
        return 0
    matches = [
        i
        for i, point in enumerate(values)
        if all(json.dumps(point.get(k)) == json.dumps(v) for k, v in wanted.items())
    ]
    if len(matches) != 1:
        found = "no point" if not matches else f"{len(matches)} points"
        raise PipelineError(f"baseline {json.dumps(wanted)}: {found} of the grid match it (need exactly one)")
    return matches[0]


def comparison(
    points: Sequence[Point],
    results: Mapping[int, dict[str, Any]],
    swept: Sequence[str],
    baseline: Point,
    seed: int,
) -> pd.DataFrame:
    """One row per (point, model): the swept values; GLUE average and tasks of the pretrained model
    (median over seeds) with their std over seeds; Δ against scratch with its interval and verdict (from
    the point's evaluate stage); Δ against the baseline point's model with interval and verdict (a paired
    bootstrap over the same dev examples, as `evaluate` does); the final pretraining loss."""
    from lmpipe.report.glue import read_aligned
    from lmpipe.report.significance import compare

    base_runs, _, base_idx = (
        read_aligned(results[baseline.index]["predictions"]) if baseline.index in results else ({}, {}, {})
    )
    rows = []
    for point in points:
        if point.index not in results:
            continue
        runs, labels, idx = read_aligned(results[point.index]["predictions"])
        for model, scores in results[point.index]["glue"].items():
            row: dict[str, Any] = {"experiment": point.experiment, "point": label(point.values, swept)}
            row.update(
                {key: _text(point.values[key]) if key == MODELS_KEY else point.values[key] for key in swept}
            )
            row["model"] = model
            tasks = [k for k in scores["pretrained"] if k != "average"]
            for key in ["average", *tasks]:
                column = "glue_average" if key == "average" else key
                row[column] = scores["pretrained"][key]
                row[f"{column}_std"] = scores["pretrained_std"][key]
            row["delta_average"] = scores["delta"]["average"]
            row["delta_average_low"] = scores["delta_low"]["average"]
            row["delta_average_high"] = scores["delta_high"]["average"]
            row["delta_average_verdict"] = scores["verdict"]["average"]
            against = model if (model, "pretrained") in base_runs else _only_model(base_runs)
            comparable = against is not None and all(
                key in base_idx and np.array_equal(idx[key], base_idx[key]) for key in labels
            )
            if not base_runs:
                status = "baseline point failed"
            elif point.index == baseline.index and against == model:
                status = "baseline"
            elif not comparable:
                status = "not comparable (other dev examples or models)"
            else:
                status = None
            mine, theirs = runs[(model, "pretrained")], base_runs.get((against, "pretrained"))
            versus = compare(mine, theirs, labels, seed) if status is None else {}
            for key in ["average", *tasks]:
                prefix = "vs_baseline" if key == "average" else f"{key}_vs_baseline"
                found = versus.get(key)
                row[prefix] = found.delta if found else float("nan")
                row[f"{prefix}_low"] = found.low if found else float("nan")
                row[f"{prefix}_high"] = found.high if found else float("nan")
                row[f"{prefix}_verdict"] = found.verdict if found else status
            pretrain = results[point.index]["pretrain"][model]
            row["pretrain_steps"], row["train_flops"] = pretrain["steps"], pretrain["train_flops"]
            curve = results[point.index]["curves"][model]["train_loss"].dropna()
            row["final_train_loss"] = float(curve.iloc[-1]) if len(curve) else float("nan")
            rows.append(row)
    return pd.DataFrame(rows)


def _only_model(runs: Mapping[tuple[str, str], Any]) -> str | None:
    models = {model for model, _ in runs}
    return next(iter(models)) if len(models) == 1 else None


def _interval(row: Mapping[str, Any], prefix: str) -> str:
    if pd.isna(row[prefix]):
        return str(row[f"{prefix}_verdict"])
    text = f"{row[prefix]:+.2f} [{row[f'{prefix}_low']:+.2f}, {row[f'{prefix}_high']:+.2f}]"
    verdict = row[f"{prefix}_verdict"]
    return f"{text} **{verdict}**" if verdict in ("better", "worse") else f"{text} {verdict}"


def task_columns(table: pd.DataFrame) -> list[str]:
    return [c[: -len("_vs_baseline_verdict")] for c in table.columns if c.endswith("_vs_baseline_verdict")]


def markdown(
    table: pd.DataFrame,
    sweep: str,
    swept: Sequence[str],
    synthetic: bool,
    baseline: Point,
    compute: str | None = None,
) -> str:
    from lmpipe.report.significance import METHOD

    tasks = task_columns(table)
    header = (
        f"# Ablation `{sweep}`\n\n"
        "GLUE validation ×100 of the pretrained models: the median over fine-tuning seeds ± the std over "
        f"seeds. Δ vs scratch: pretrained − scratch of the same point. Δ vs baseline: against point "
        f"`{label(baseline.values, swept)}` ({baseline.experiment}), the same model (or its only model). "
        f"Intervals are 95 %, from a {METHOD}; `better`/`worse` when the interval excludes 0.\n"
    )
    if compute:
        header += f"\nEqual compute: every point pretrains on a budget of {compute}.\n"
    if synthetic:
        header += "\n> **Synthetic data** (offline default profile): shows the pipeline, not the papers.\n"
    columns = ["experiment", *swept, "model", "GLUE average", *tasks, "Δ vs scratch", "Δ vs baseline"]
    columns += ["pretrain steps", "pretrain FLOPs", "final train loss"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table.to_dict("records"):
        cells = [row["experiment"], *(str(row[k]) for k in swept), row["model"]]
        cells += [f"{row['glue_average']:.2f} ± {row['glue_average_std']:.2f}"]
        cells += [f"{row[t]:.2f} ± {row[f'{t}_std']:.2f}" for t in tasks]
        cells += [_interval(row, "delta_average")]
        cells += [_interval(row, "vs_baseline"), f"{row['pretrain_steps']}", f"{row['train_flops']:.3g}"]
        cells += [f"{row['final_train_loss']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per task, Δ vs baseline:", ""]
    lines += ["| experiment | model | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    for row in table.to_dict("records"):
        cells = [_interval(row, f"{t}_vs_baseline") for t in tasks]
        lines.append(f"| {row['experiment']} | {row['model']} | " + " | ".join(cells) + " |")
    return header + "\n" + "\n".join(lines) + "\n"


def plot_scores(table: pd.DataFrame, swept: Sequence[str]) -> bytes:
    """GLUE average and each task against the swept value, one line per model, error bars the std over
    seeds; filled markers differ from the baseline (better or worse), hollow ones are within noise; a
    dotted line marks the baseline point's level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["glue_average", *task_columns(table)]
    numeric = len(swept) == 1 and swept[0] != MODELS_KEY and pd.api.types.is_numeric_dtype(table[swept[0]])
    x_of = (lambda frame: frame[swept[0]]) if numeric else (lambda frame: frame["point"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        verdict = "vs_baseline_verdict" if metric == "glue_average" else f"{metric}_vs_baseline_verdict"
        for model, frame in table.groupby("model", sort=False):
            line = ax.errorbar(
                x_of(frame), frame[metric], yerr=frame[f"{metric}_std"], capsize=3, label=model
            )
            differs = frame[verdict].isin(["better", "worse"])
            ax.plot(x_of(frame)[differs], frame[metric][differs], "o", color=line[0].get_color())
            ax.plot(
                x_of(frame)[~differs], frame[metric][~differs], "o", mfc="white", color=line[0].get_color()
            )
            for value in frame[metric][frame["vs_baseline_verdict"] == "baseline"]:
                ax.axhline(value, linestyle=":", color=line[0].get_color())  # the baseline's level
        ax.set_title("GLUE average" if metric == "glue_average" else metric)
        ax.set_xlabel(swept[0] if numeric else "point")
        ax.tick_params(axis="x", labelrotation=0 if numeric else 30)
    axes[0][0].set_ylabel("score ×100 (± std over seeds)")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    return png(fig, plt)


def plot_losses(
    points: Sequence[Point], results: Mapping[int, dict[str, Any]], swept: Sequence[str]
) -> bytes:
    """The pretraining loss curves of every point and model, overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for point in points:
        for model, curve in results.get(point.index, {}).get("curves", {}).items():
            train = curve.dropna(subset=["train_loss"])
            ax.plot(train["step"], train["train_loss"], label=f"{model}: {label(point.values, swept)}")
    ax.set_xlabel("step")
    ax.set_ylabel("pretraining train loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return png(fig, plt)


def png(fig: Any, plt: Any) -> bytes:
    """A matplotlib figure as PNG bytes without a timestamp (the same plot, the same bytes), closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


@flow(name="ablation", log_prints=True)
def ablation(
    preset: str | None = None,
    grid: dict[str, list[Any]] | list[dict[str, Any]] | None = None,
    repo: str = ".",
    max_parallel: int = 2,
    name: str | None = None,
    baseline: dict[str, Any] | None = None,
    profile: str | None = None,
    corpus: str | None = None,
    glue: str | None = None,
    pool: str | None = None,
    dvc_remote: str | None = None,
    git_remote: str = "origin",
) -> dict[str, Any]:
    """Run every point of `grid` (or of a named preset) as a DVC experiment; compare them, each against
    the `baseline` point (the values that identify it; by default the preset's, else the first point).
    With a `profile` (flows/profiles/<name>.yaml, its folders `corpus` and `glue`) every point runs on
    the profile's params, the point's values on top.

    With a `pool`, every point is a flow run of the deployment `ablation-point-<pool>` on any worker
    of that work pool (flows/dispatch.py): the committed and pushed HEAD, results through the
    `git_remote` and the DVC remote (`dvc_remote`, else the project's default), a crashed point run
    again up to the graph's largest `meta.retries` times. `max_parallel` caps the points in flight.

    Returns the comparison rows and where the report is; a failed point fails the flow after the
    comparison of the others is written.
    """
    logger = get_run_logger()
    repo_dir = Path(repo).resolve()
    points_spec = resolve_grid(preset, grid)
    sweep = name or f"{preset or 'sweep'}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
    if not EXPERIMENT_NAME.match(sweep):
        raise PipelineError(f"sweep name '{sweep}': letters, digits, '-', '_' and '.' only")
    params_file = repo_dir / PARAMS_FILE
    values = expand(points_spec)
    on_profile = profiles.overrides(profile, corpus, glue) if profile else []
    origin = f"profile {profile}" if profile else str(params_file)
    params = profiles.applied(repo_dir, on_profile, origin)
    overrides = [[*on_profile, *point_overrides(point, params, params_file)] for point in values]
    validated = [profiles.validate(repo_dir, point, origin) for point in overrides]  # every point, up front
    synthetic = validated[0].glue.synthetic
    keys = list(dict.fromkeys(key for point in values for key in point))
    swept = [key for key in keys if len({json.dumps(p.get(key), sort_keys=True) for p in values}) > 1]
    base = baseline_index(values, baseline, preset)
    compute = None
    if preset in EQUAL_FLOPS:
        budget, compute = equal_flops_budget(validated, base)
        overrides = [[*point, f"pretrain.max_flops={budget!r}"] for point in overrides]
    if max_parallel < 1:
        raise PipelineError("max_parallel must be at least 1")

    tracking = FlowTracking(repo_dir, tracking_experiment(params_file))
    target = pool_target_pushed(repo_dir, pool, tracking.uri, git_remote, dvc_remote) if pool else None
    if target is not None:
        overrides = [target.overrides(point) for point in overrides]
    parent = tracking.start(
        sweep, {"stage": "ablation", "sweep": sweep, "preset": preset or "", "git_commit": git_commit()}
    )
    tracking.log(parent, {"points": len(values)}, {"grid": json.dumps(points_spec), "swept": ",".join(swept)})
    points = []
    for index, (point_values, point_overrides_) in enumerate(zip(values, overrides, strict=True), start=1):
        experiment = f"{sweep}-{index}"
        tags = {"stage": "ablation_point", "sweep": sweep, "dvc_experiment": experiment, "point": index}
        tags.update({f"param.{key}": _text(value) for key, value in point_values.items()})
        run_id = tracking.start(experiment, tags, parent=parent)
        points.append(Point(index, experiment, point_values, point_overrides_, run_id))
    logger.info("sweep %s: %d points over %s, %d at once", sweep, len(points), swept or keys, max_parallel)

    results, failed = run_points(repo_dir, points, tracking.uri, max_parallel, target)
    for point in points:
        if point.index in failed:
            tracking.client.set_terminated(point.run_id, "FAILED")
            continue
        scores = results[point.index]["glue"]
        metrics = {
            f"glue.{model}.{init}.{key}": value
            for model, inits in scores.items()
            for init, by_key in inits.items()
            for key, value in by_key.items()
            if isinstance(value, int | float)
        }
        metrics["duration_s"] = results[point.index]["seconds"]
        tracking.log(point.run_id, metrics, {k: _text(v) for k, v in point.values.items()})
        tracking.client.set_terminated(point.run_id, "FINISHED")

    out = repo_dir / "reports" / "ablation" / sweep
    table = comparison(points, results, swept, points[base], int(params.get("seed", 0)))
    if len(table):
        out.mkdir(parents=True, exist_ok=True)
        text = markdown(table, sweep, swept, synthetic, points[base], compute)
        if target is not None:
            text += where_points_ran(points, results, failed, target, tracking)
        table.to_csv(out / "comparison.csv", index=False)
        (out / "comparison.md").write_text(text)
        (out / "glue.png").write_bytes(plot_scores(table, swept))
        (out / "pretrain_loss.png").write_bytes(plot_losses(points, results, swept))
        for path in sorted(out.iterdir()):
            tracking.client.log_artifact(parent, str(path))
        create_markdown_artifact((out / "comparison.md").read_text(), key="ablation-comparison")
        logger.info(
            "comparison of %d points: %s\n%s",
            table["experiment"].nunique(),
            out,
            text,
        )
    tracking.client.set_terminated(parent, "FAILED" if failed else "FINISHED")
    if failed:
        raise PointsFailed(failed)
    return {"sweep": sweep, "report": str(out), "parent_run_id": parent, "rows": table.to_dict("records")}


class PointsFailed(FlowFailed):
    def __init__(self, failed: Mapping[int, str]) -> None:
        super().__init__(f"{len(failed)} point(s) failed: " + "; ".join(failed.values()))
        self.failed = dict(failed)


def resolve_grid(
    preset: str | None, grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None
) -> Any:
    if (preset is None) == (grid is None):
        raise PipelineError(f"give either a preset ({', '.join(PRESETS)}) or a grid, not both or neither")
    if preset is not None and preset not in PRESETS:
        raise PipelineError(f"preset '{preset}' is unknown (presets: {', '.join(PRESETS)})")
    return PRESETS[preset] if preset is not None else grid


def pool_target_pushed(
    repo_dir: Path, pool: str, tracking_uri: str, git_remote: str, dvc_remote: str | None
) -> Target:
    """The pool's target, checked (flows.dispatch.pool_target), with the workspace's outputs and run
    cache on the DVC remote: a point's unchanged stages come from there."""
    target = pool_target(repo_dir, pool, "ablation-point", tracking_uri, git_remote, dvc_remote)
    pushed = dvc(repo_dir, "push", "--run-cache", *target.dvc_remote_args())
    if pushed.returncode != 0:
        raise PipelineError(f"dvc push: {last_line(pushed.stderr or pushed.stdout)}")
    return target


def where_points_ran(
    points: Sequence[Point],
    results: Mapping[int, dict[str, Any]],
    failed: Mapping[int, str],
    target: Target,
    tracking: FlowTracking,
) -> str:
    """The sweep's dispatch summary: each point's attempts (worker and outcome) and how long it waited
    between submit and its first stage."""
    lines = ["", f"Points ran on work pool `{target.pool}` at commit `{target.revision[:12]}`:", ""]
    lines += ["| experiment | attempts | submit → first stage (s) |", "|---|---|---:|"]
    for point in points:
        tags = tracking.client.get_run(point.run_id).data.tags
        if point.index in results:
            attempts = "; then ".join(a.line() for a in results[point.index]["attempts"])
        else:
            attempts = failed[point.index].split(": ", 1)[-1]
        lines.append(f"| {point.experiment} | {attempts} | {tags.get(DISPATCH_TAG, '—')} |")
    return "\n".join(lines) + "\n"


def run_points(
    repo_dir: Path,
    points: Sequence[Point],
    tracking_uri: str,
    max_parallel: int,
    target: Target | None = None,
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    logger = get_run_logger()
    # on a pool, a crashed point runs again as often as the graph's most patient stage (meta.retries)
    retries = max((node.retries for node in read_graph(repo_dir).values()), default=0) if target else 0
    results: dict[int, dict[str, Any]] = {}
    failed: dict[int, str] = {}
    waiting = list(points)
    running: dict[Any, Point] = {}
    while waiting or running:
        while waiting and len(running) < max_parallel:
            point = waiting.pop(0)
            future = (
                run_point_on_pool.submit(repo_dir, point, target, retries)
                if target is not None
                else run_point.submit(repo_dir, point, tracking_uri)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.ablation", description=__doc__.split("\n")[0])
    parser.add_argument(
        "preset", nargs="?", choices=[*PRESETS, "scaling"], help="a named sweep (scaling: flows/scaling.py)"
    )
    parser.add_argument("--grid", help='JSON: {"key": [values], ...} (product) or [{"key": value}, ...]')
    parser.add_argument("--repo", default=".", help="the DVC project (default: here)")
    parser.add_argument("--max-parallel", type=int, default=2, help="points at once (default 2)")
    parser.add_argument("--name", help="the sweep's name (default: preset and UTC time)")
    parser.add_argument("--profile", help=f"run on a params profile ({', '.join(profiles.available())})")
    parser.add_argument("--corpus", help="the profile's text folder")
    parser.add_argument("--glue", help="the profile's GLUE folder")
    parser.add_argument(
        "--baseline",
        help='JSON: the values of the point the others are compared with, e.g. {"pretrain.lr": 0.001} '
        "(default: the preset's, else the first point)",
    )
    parser.add_argument("--pool", help="run every point as a flow run on this Prefect work pool")
    parser.add_argument("--dvc-remote", help="with --pool: the DVC remote (default: the project's default)")
    parser.add_argument("--git-remote", default="origin", help="with --pool: the git remote (default origin)")
    parser.add_argument(
        "--tokens-per-parameter", type=float, help="scaling: tokens per non-embedding parameter (default 20)"
    )
    parser.add_argument(
        "--sizes", help="scaling: JSON [[d_model, n_layers, n_heads], ...] (default: the ladder)"
    )
    args = parser.parse_args(argv)

    def run_options() -> dict[str, Any]:
        """What every sweep takes from the command line, the profile's folders checked first."""
        if args.profile:
            profiles.overrides(args.profile, args.corpus, args.glue)
        names = [
            "repo",
            "max_parallel",
            "name",
            "profile",
            "corpus",
            "glue",
            "pool",
            "dvc_remote",
            "git_remote",
        ]
        return {key: getattr(args, key) for key in names}

    def scaling_body() -> str:
        from flows.scaling import LADDER, TOKENS_PER_PARAMETER, ladder_points, scaling

        if args.grid or args.baseline:
            raise PipelineError("scaling: --grid and --baseline do not apply (the ladder is its grid)")
        try:
            sizes = json.loads(args.sizes) if args.sizes else LADDER
        except json.JSONDecodeError as exc:
            raise PipelineError(f"--sizes is not JSON: {exc}") from None
        if not isinstance(sizes, list) or not all(
            isinstance(size, list | tuple)
            and len(size) == 3
            and all(isinstance(v, int) and v > 0 for v in size)
            for size in sizes
        ):
            raise PipelineError(
                "--sizes: give a list of [d_model, n_layers, n_heads], e.g. [[128, 2, 2], ...]"
            )
        ladder_points([tuple(size) for size in sizes])  # at least 4, heads dividing d_model
        result = scaling(
            tokens_per_parameter=args.tokens_per_parameter or TOKENS_PER_PARAMETER,
            sizes=[tuple(size) for size in sizes],
            **run_options(),
        )
        return f"scaling fit: {result['report']}/scaling.md"

    if args.tokens_per_parameter is not None and args.tokens_per_parameter <= 0:
        parser.error("--tokens-per-parameter must be > 0")

    def body() -> str:
        if args.preset == "scaling":
            return scaling_body()
        if args.tokens_per_parameter is not None or args.sizes:
            raise PipelineError("--tokens-per-parameter and --sizes are for the scaling preset")
        try:
            grid = json.loads(args.grid) if args.grid else None
            baseline = json.loads(args.baseline) if args.baseline else None
        except json.JSONDecodeError as exc:
            raise PipelineError(f"--grid/--baseline is not JSON: {exc}") from None
        # bad input is one line before any flow starts
        repo_dir = Path(args.repo).resolve()
        params_file = repo_dir / PARAMS_FILE
        params = read_params_yaml(params_file) or {}
        values = expand(resolve_grid(args.preset, grid))
        for point in values:
            point_overrides(point, params, params_file)
        if baseline is not None and not isinstance(baseline, dict):
            raise PipelineError('--baseline: give an object of values, e.g. {"pretrain.lr": 0.001}')
        baseline_index(values, baseline, args.preset)
        result = ablation(preset=args.preset, grid=grid, baseline=baseline, **run_options())
        return f"comparison: {result['report']}/comparison.md"

    return cli(body)


if __name__ == "__main__":
    sys.exit(main())
