"""The scaling sweep: a ladder of decoder sizes pretrained on the same data at a fixed number of
tokens per parameter, and Kaplan et al. (2020)'s L(N) = a·N^(−α) + c fitted to their validation
losses (scipy.optimize.curve_fit, with the parameters' standard errors), extrapolated to ten times
the largest size.

N counts the non-embedding parameters, as Kaplan's N does: at these sizes the embeddings are most of
the model, and counting them bends the curve. What sweeps share (points, pools, MLflow, the command
line): flows/sweep.py.

    python -m flows.scaling
    python -m flows.scaling --tokens-per-parameter 2 --sizes '[[64,2,2],[96,2,2],[128,2,2],[192,3,3]]'
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

from flows.common import PipelineError
from flows.sweep import (
    Corpus,
    DvcRemote,
    GitRemote,
    Glue,
    MaxParallel,
    Option,
    Pool,
    Profile,
    Repo,
    Sweep,
    SweepName,
    command_line,
    png,
    points_at_once,
)

MODEL = "decoder_clm"  # Kaplan's L(N) is a decoder's
# (d_model, n_layers, n_heads) from `tiny` upward, d_ff = 4·d_model: non-embedding N 0.39 M to 4.9 M
LADDER: tuple[tuple[int, int, int], ...] = ((128, 2, 2), (192, 2, 3), (256, 3, 4), (320, 4, 5))
TOKENS_PER_PARAMETER = 20.0  # Chinchilla's compute-optimal ratio
KAPLAN_ALPHA_N = 0.076


def non_embedding_parameters(d_model: int, n_layers: int, d_ff: int, mlp: str = "gelu") -> int:
    """Kaplan's N: the weights of the blocks (attention and MLP matrices; biases and norms are noise)."""
    from models.stack_flops import block_weights

    return n_layers * block_weights(d_model, d_ff, mlp)


def ladder_points(sizes: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """The sweep's points: the model variant of params.yaml at each size (the other models removed)."""
    if not isinstance(sizes, list | tuple) or not all(
        isinstance(size, list | tuple) and len(size) == 3 and all(isinstance(v, int) and v > 0 for v in size)
        for size in sizes
    ):
        raise PipelineError(
            "scaling: give sizes as a list of [d_model, n_layers, n_heads], e.g. [[128, 2, 2], ...]"
        )
    if len(sizes) < 4:
        raise PipelineError(
            f"scaling: give at least 4 sizes to fit 3 parameters with a check, not {len(sizes)}"
        )
    points = []
    for d_model, n_layers, n_heads in sizes:
        if d_model % n_heads:
            raise PipelineError(
                f"scaling: size ({d_model}, {n_layers}, {n_heads}): d_model not divisible by heads"
            )
        size = {"d_model": d_model, "n_layers": n_layers, "n_heads": n_heads, "d_ff": 4 * d_model}
        # ++: set on the variant whether or not params.yaml names the field (its preset may size it)
        points.append({"models": MODEL, **{f"++models.{MODEL}.{key}": value for key, value in size.items()}})
    return points


def budget_override(n: int, tokens_per_step: int, ratio: float) -> tuple[str, int]:
    """The point's step budget (D = ratio·N tokens, a tenth of it warmup, no wall-clock cap) as one
    override of its model's own pretrain values."""
    steps = max(10, math.ceil(ratio * n / tokens_per_step))
    budget = (
        f"++models.{MODEL}.pretrain={{max_steps:{steps},warmup_steps:{max(1, steps // 10)},max_minutes:null}}"
    )
    return budget, steps


@dataclass(frozen=True)
class Fit:
    a: float
    alpha: float
    c: float
    errors: tuple[float, float, float]  # standard errors of a, alpha, c
    extrapolated_n: float
    extrapolated_loss: float
    extrapolated_error: float


def law(n: np.ndarray, a: float, alpha: float, c: float) -> np.ndarray:
    return a * np.power(n, -alpha) + c


def fit_law(n: Sequence[float], loss: Sequence[float]) -> Fit:
    """L(N) = a·N^(−α) + c by least squares; errors from the covariance curve_fit estimates."""
    from scipy.optimize import curve_fit

    n_values, losses = np.asarray(n, dtype=float), np.asarray(loss, dtype=float)
    start = (
        float(losses.max() - losses.min()) * float(n_values.min()) ** 0.3 + 1e-3,
        0.3,
        float(losses.min()) * 0.9,
    )
    params, covariance = curve_fit(
        law,
        n_values,
        losses,
        p0=start,
        bounds=([0.0, 0.0, 0.0], [np.inf, 3.0, float(losses.min())]),
        maxfev=20000,
    )
    errors = np.sqrt(np.clip(np.diag(covariance), 0, None))
    far = 10.0 * float(n_values.max())
    # the extrapolation's standard error by the delta method: gradient of L(far) in (a, alpha, c)
    a, alpha, _ = params
    gradient = np.array([far**-alpha, -a * math.log(far) * far**-alpha, 1.0])
    spread = float(np.sqrt(max(gradient @ covariance @ gradient, 0.0)))
    return Fit(*map(float, params), tuple(map(float, errors)), far, float(law(far, *params)), spread)


@dataclass(frozen=True)
class PowerFit:
    """Kaplan's own form, L(N) = (N_c / N)^α_N with no irreducible term: the α comparable to 0.076."""

    alpha: float
    error: float  # standard error of the slope of log L on log N


def fit_power(n: Sequence[float], loss: Sequence[float]) -> PowerFit:
    from scipy.stats import linregress

    line = linregress(np.log(np.asarray(n, dtype=float)), np.log(np.asarray(loss, dtype=float)))
    return PowerFit(-float(line.slope), float(line.stderr))


def markdown(
    rows: Sequence[dict[str, Any]],
    fit: Fit | None,
    power: PowerFit | None,
    failure: str | None,
    sweep: str,
    ratio: float,
    synthetic: bool,
) -> str:
    lines = [
        f"# Scaling `{sweep}`: L(N) = a·N^(−α) + c",
        "",
        f"Every size trains `{MODEL}` on the same data for {ratio:g} tokens per non-embedding parameter "
        "(Kaplan's N); the loss is the validation loss at the end.",
    ]
    if synthetic:
        lines += ["", "> **Synthetic data** (offline default profile): shows the machinery, not a law."]
    lines += [
        "",
        "| experiment | d_model | layers | N (non-embedding) | tokens | steps | val loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['experiment']} | {row['d_model']} | {row['n_layers']} | {row['n']:,} "
            f"| {row['tokens']:,} | {row['steps']} | {row['val_loss']:.4f} |"
        )
    lines.append("")
    if fit is None:
        lines.append(f"The fit did not converge: {failure}")
    else:
        ea, ealpha, ec = fit.errors
        lines += [
            f"Fit (scipy.optimize.curve_fit, ± one standard error): a = {fit.a:.3g} ± {ea:.2g}, "
            f"**α = {fit.alpha:.3f} ± {ealpha:.3f}**, c = {fit.c:.3f} ± {ec:.3f}.",
            "",
            f"Extrapolated to N = {fit.extrapolated_n:,.0f} (10× the largest): "
            f"L = {fit.extrapolated_loss:.3f} ± {fit.extrapolated_error:.3f}.",
            "",
            f"Kaplan et al. (2020) report α_N ≈ {KAPLAN_ALPHA_N} for decoders from 10⁵ to 10⁹ parameters "
            "trained to convergence on WebText2, in the form L = (N_c/N)^α_N, without c.",
        ]
    if power is not None:
        lines += [
            "",
            f"Kaplan's form fitted to the same points (log L on log N): α_N = {power.alpha:.3f} "
            f"± {power.error:.3f}.",
        ]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], fit: Fit | None, power: PowerFit | None) -> bytes:
    """Log-log: the measured losses, the fitted law out to 10× the largest size, the extrapolation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = np.array([row["n"] for row in rows], dtype=float)
    loss = np.array([row["val_loss"] for row in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(n, loss, "o", label="measured (val loss)")
    if fit is not None:
        grid = np.geomspace(n.min() / 1.5, fit.extrapolated_n * 1.2, 200)
        ax.plot(
            grid, law(grid, fit.a, fit.alpha, fit.c), "-", label=f"fit: α = {fit.alpha:.3f}, c = {fit.c:.2f}"
        )
        if power is not None:  # through the points' geometric centre, as the regression line runs
            centre_n, centre_loss = np.exp(np.log(n).mean()), np.exp(np.log(loss).mean())
            ax.plot(
                grid,
                centre_loss * (grid / centre_n) ** -power.alpha,
                "--",
                color="grey",
                label=f"Kaplan's form, no c: α = {power.alpha:.3f}",
            )
        ax.errorbar(
            [fit.extrapolated_n],
            [fit.extrapolated_loss],
            yerr=[fit.extrapolated_error],
            fmt="s",
            capsize=3,
            label="10× the largest",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    for formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        formatter(ScalarFormatter())  # losses as 4, 5, 6, not 4×10⁰
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("validation loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return png(fig, plt)


@flow(name="scaling", log_prints=True)
def scaling(
    tokens_per_parameter: Annotated[
        float, Option(f"tokens per non-embedding parameter (default {TOKENS_PER_PARAMETER:g})")
    ] = TOKENS_PER_PARAMETER,
    sizes: Annotated[
        Sequence[Sequence[int]], Option("JSON: [[d_model, n_layers, n_heads], ...] (default: the ladder)")
    ] = LADDER,
    repo: Repo = ".",
    max_parallel: MaxParallel = None,
    name: SweepName = None,
    profile: Profile = None,
    corpus: Corpus = None,
    glue: Glue = None,
    pool: Pool = None,
    dvc_remote: DvcRemote = None,
    git_remote: GitRemote = "origin",
) -> dict[str, Any]:
    """Pretrain `decoder_clm` at every size of the ladder (each a DVC experiment running only its
    pretrain stage), on `tokens_per_parameter` tokens per non-embedding parameter, then fit and plot
    L(N). The profile, the pool and the MLflow layout are every sweep's (flows/sweep.py)."""
    from lmpipe.pretraining import world_size

    logger = get_run_logger()
    if tokens_per_parameter <= 0:
        raise PipelineError("scaling: tokens_per_parameter must be > 0")
    values = ladder_points(sizes)
    sweep = Sweep("scaling", repo, name, points_at_once(max_parallel, pool), profile, corpus, glue)
    base = sweep.validate(sweep.on_profile)
    if MODEL not in base.models:
        raise PipelineError(f"scaling: {sweep.origin} has no model '{MODEL}' (the ladder scales a decoder)")
    planned, rows = [], []
    for point in values:
        given = sweep.overrides(point)
        params = sweep.validate(given)
        model = params.models[MODEL].config(params.tokenizer.vocab_size)
        run = params.pretrain_of(MODEL)
        n = non_embedding_parameters(model.d_model, model.n_layers, model.d_ff, model.mlp)
        tokens_per_step = run.batch_size * run.seq_len * run.accumulate * world_size(run)
        budget, steps = budget_override(n, tokens_per_step, tokens_per_parameter)
        sweep.validate([*given, budget])  # every point, up front
        tags = {"param.d_model": model.d_model, "param.n_layers": model.n_layers}
        planned.append(({}, [*given, budget], tags))
        rows.append({"d_model": model.d_model, "n_layers": model.n_layers, "n": n, "steps": steps})

    tags, metrics = {"preset": "scaling"}, {"tokens_per_parameter": tokens_per_parameter}
    points = sweep.start(
        planned, tags, metrics, {"sizes": str(sizes)}, pool, git_remote, dvc_remote, (f"pretrain@{MODEL}",)
    )
    logger.info("sweep %s: %d sizes, %g tokens per parameter", sweep.name, len(points), tokens_per_parameter)

    results, failed = sweep.run(points)
    measured = []
    for point, row in zip(points, rows, strict=True):
        if point.index in failed:
            sweep.fail_point(point)
            continue
        summary = results[point.index]["pretrain"][MODEL]
        row |= {
            "experiment": point.experiment,
            "tokens": summary["tokens_seen"],
            "val_loss": summary["val_loss"],
        }
        row["train_flops"] = summary.get("train_flops")
        measured.append(row)
        sweep.finish_point(point, {"n": row["n"], "tokens": row["tokens"], "val_loss": row["val_loss"]}, {})

    fit, power, failure = None, None, None
    if len(measured) >= 4:
        sizes_n, losses = [r["n"] for r in measured], [r["val_loss"] for r in measured]
        power = fit_power(sizes_n, losses)
        try:
            fit = fit_law(sizes_n, losses)
        except (RuntimeError, ValueError) as exc:  # curve_fit's "optimal parameters not found"
            failure = " ".join(str(exc).split())
    else:
        failure = f"{len(measured)} sizes finished, 4 are needed"
    report = markdown(measured, fit, power, failure, sweep.name, tokens_per_parameter, base.glue.synthetic)
    report += sweep.where_points_ran(points, results, failed)
    files = {
        "scaling.md": report,
        "scaling.csv": pd.DataFrame(measured).to_csv(index=False),
        "scaling.png": plot(measured, fit, power),
    }
    sweep.publish(files, "scaling.md", "scaling-fit")
    logger.info("scaling fit: %s\n%s", sweep.out, report)
    fitted: dict[str, float] | None = None
    parent_metrics: dict[str, float] = {}
    if fit is not None:
        fitted = {"alpha": fit.alpha, "alpha_error": fit.errors[1], "c": fit.c}
        parent_metrics = {**fitted, "a": fit.a}
        parent_metrics |= {
            "extrapolated_loss": fit.extrapolated_loss,
            "extrapolated_error": fit.extrapolated_error,
        }
        if power is not None:
            kaplan = {"alpha_kaplan_form": power.alpha, "alpha_kaplan_form_error": power.error}
            fitted |= kaplan
            parent_metrics |= kaplan
    sweep.close(parent_metrics, failed)
    return {
        "sweep": sweep.name,
        "report": str(sweep.out),
        "parent_run_id": sweep.parent,
        "rows": measured,
        "fit": fitted,
    }


def check(arguments: dict[str, Any]) -> None:
    """The command line's input, one line each, before any flow starts."""
    if arguments["tokens_per_parameter"] <= 0:
        raise PipelineError("--tokens-per-parameter must be > 0")
    ladder_points(arguments["sizes"])  # at least 4, heads dividing d_model


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(scaling, argv, check, lambda result: f"scaling fit: {result['report']}/scaling.md")


if __name__ == "__main__":
    sys.exit(main())
