"""The GLUE report of stage `evaluate`: every prediction scored, the spread over seeds, the
pretrained-vs-scratch differences with their verdicts, the report, table and chart, and the scores
linked to their MLflow runs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmpipe.glue.metrics import glue_average, scores
from lmpipe.glue.tasks import TASKS, GlueTask
from lmpipe.layout import (
    GLUE,
    GLUE_CHART,
    GLUE_METRICS,
    GLUE_PLOT,
    GLUE_REPORT,
    GLUE_TABLE,
    INITS,
    PREDICTIONS,
    finetune_dir,
    finetune_stage,
    predictions_sha256,
)
from lmpipe.params.finetune import FinetuneSections
from lmpipe.report.significance import METHOD, VERDICTS, Difference, compare
from lmpipe.runtime import StageError, atomic_file, log, read_json, write_json
from lmpipe.tracking import tracking_experiment

METRIC_NAMES = {
    "accuracy": "Acc",
    "f1": "F1",
    "matthews_correlation": "MCC",
    "pearson": "Pearson",
    "spearmanr": "Spearman",
}


def evaluation_key(task: GlueTask, split: str) -> str:
    """'sst2'; MNLI's two validation sets are 'mnli-m' and 'mnli-mm'."""
    if split == "validation":
        return task.name
    return f"{task.name}-{'mm' if split.endswith('mismatched') else 'm'}"


def evaluation_title(key: str) -> str:
    task, _, suffix = key.partition("-")
    return TASKS[task].title + (f"-{suffix}" if suffix else "")


@dataclass
class Scored:
    """Every fine-tune's per-seed scores and its predictions, aligned for paired comparisons."""

    table: pd.DataFrame  # model, init, task, evaluation, seed, metric, value (fractions)
    labels: dict[str, np.ndarray]  # evaluation -> labels, by ascending idx
    predictions: dict[tuple[str, str, str], np.ndarray]  # (model, init, evaluation) -> [seeds, examples]
    idx: dict[str, np.ndarray]  # evaluation -> the idx of its examples

    def of(self, model: str, init: str) -> dict[str, np.ndarray]:
        return {key: self.predictions[(model, init, key)] for key in self.labels}


def read_predictions(path: Path, task: GlueTask, split: str, truth: pd.DataFrame) -> pd.DataFrame:
    """One seed's predictions joined with the split's labels (`idx, prediction, label`), by idx."""
    try:
        predictions = pd.read_parquet(path, columns=["idx", "prediction"])
    except FileNotFoundError:
        raise StageError(f"{path}: missing; run the fine-tuning stages first (dvc repro)") from None
    if predictions.empty or predictions["idx"].duplicated().any():
        raise StageError(f"{path}: expected one prediction per example, got {len(predictions)} rows")
    joined = predictions.merge(truth, on="idx", how="left")
    if joined["label"].isna().any():
        row = int(joined.index[joined["label"].isna()][0])
        raise StageError(
            f"{path}: row {row}: idx {joined['idx'][row]} is not in data/glue/{task.name}/{split}.parquet"
        )
    return joined.sort_values("idx", kind="stable").reset_index(drop=True)


def collect(params: FinetuneSections) -> Scored:
    # every split's labels read once, however many models, inits and seeds are scored on them
    truth = {
        (name, split): pd.read_parquet(GLUE / name / f"{split}.parquet", columns=["idx", "label"])
        for name in params.glue.tasks
        for split in TASKS[name].eval_splits
    }
    labels: dict[str, np.ndarray] = {}
    idx: dict[str, np.ndarray] = {}
    predictions: dict[tuple[str, str, str], np.ndarray] = {}
    rows = []
    for model in params.models:
        for name in params.glue.tasks:
            task = TASKS[name]
            for init in INITS:
                run_dir = finetune_dir(model, name, init)
                summary = read_json(run_dir / "summary.json", finetune_stage(model))
                missing = [s for s in params.finetune.seeds if str(s) not in summary["seeds"]]
                if missing:
                    raise StageError(
                        f"{run_dir}/summary.json: no run for seed(s) {missing} of finetune.seeds; "
                        "re-run the fine-tuning stages (dvc repro)"
                    )
                for split in task.eval_splits:
                    key = evaluation_key(task, split)
                    per_seed = []
                    for seed in params.finetune.seeds:
                        path = run_dir / f"seed{seed}" / f"{split}.parquet"
                        joined = read_predictions(path, task, split, truth[(name, split)])
                        examples = joined["idx"].to_numpy()
                        if key not in idx:
                            idx[key], labels[key] = examples, joined["label"].to_numpy()
                        elif not np.array_equal(examples, idx[key]):
                            raise StageError(
                                f"{path}: predicts other examples than the other fine-tunes of "
                                f"{evaluation_title(key)} ({len(examples)} vs {len(idx[key])} rows); "
                                "re-run the fine-tuning stages (dvc repro)"
                            )
                        per_seed.append(joined["prediction"].to_numpy())
                        found = scores(task, per_seed[-1], labels[key])
                        for metric, value in found.items():
                            rows.append((model, init, name, key, seed, metric, value))
                    predictions[(model, init, key)] = np.stack(per_seed)
    table = pd.DataFrame(rows, columns=["model", "init", "task", "evaluation", "seed", "metric", "value"])
    return Scored(table, labels, predictions, idx)


def log_to_finetune_runs(table: pd.DataFrame, experiment: str) -> None:
    """Each fine-tune's MLflow run gets its own GLUE scores (`<evaluation>/<metric>`), so the runs of
    one (model, task, seed) compare in the MLflow UI as they do in the report. The run is the one
    tagged with the digest of the very predictions scored."""
    from lmpipe.tracking import PREDICTIONS_TAG, find_run, finetune_run_key, log_to_run

    missing = 0
    for (model, init, name, seed), rows in table.groupby(["model", "init", "task", "seed"], sort=False):
        tags = {
            **finetune_run_key(model, name, init, seed),
            PREDICTIONS_TAG: predictions_sha256(finetune_dir(model, name, init) / f"seed{seed}"),
        }
        run_id = find_run(experiment, tags)
        if run_id is None:
            missing += 1
        else:
            log_to_run(run_id, {f"{r.evaluation}/{r.metric}": r.value for r in rows.itertuples()})
    if missing:
        log.warning(
            "evaluate: %d fine-tune runs are not in this MLflow store; their scores are in reports/", missing
        )


def log_to_model_runs(
    params: FinetuneSections,
    summary: dict[str, Any],
    versus_scratch: dict[str, dict[str, Difference]],
    parent: str,
) -> None:
    """What the MLflow UI shows without set-up: each model's pretrain run (found by the digest of the
    weights its fine-tunes loaded) and this execution's parent run get the model's GLUE scores and Δ
    vs scratch as metrics (`glue.<task>`, `glue.delta.<task>`) and the verdicts as tags."""
    from lmpipe.tracking import WEIGHTS_TAG, close_pipeline_run, find_run, log_to_run, set_run_tags

    experiment = tracking_experiment()
    for model, found in versus_scratch.items():
        scores_of = {f"glue.{key}": value for key, value in summary[model]["pretrained"].items()}
        scores_of |= {f"glue.delta.{key}": d.delta for key, d in found.items()}
        verdicts = {f"verdict.{key}": d.verdict for key, d in found.items()}
        task = params.glue.tasks[0]
        ran = read_json(
            finetune_dir(model, task, "pretrained") / "summary.json",
            finetune_stage(model),
        )
        weights = ran.get("weights_sha256")
        run_id = weights and find_run(experiment, {"stage": "pretrain", "model": model, WEIGHTS_TAG: weights})
        if not run_id:
            log.warning("evaluate: the pretrain run of %s is not in this MLflow store", model)
        else:
            log_to_run(run_id, scores_of)
            set_run_tags(run_id, verdicts)
        log_to_run(parent, {f"{model}.{key}": value for key, value in scores_of.items()})
    close_pipeline_run(parent)


def summarize(table: pd.DataFrame) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """model -> init -> evaluation -> metric -> median over seeds."""
    medians: dict[str, Any] = {}
    grouped = table.groupby(["model", "init", "evaluation", "metric"], sort=False)["value"]
    for (model, init, evaluation, metric), values in grouped:
        medians.setdefault(model, {}).setdefault(init, {}).setdefault(evaluation, {})[metric] = float(
            statistics.median(values)
        )
    return medians


def seed_spread(table: pd.DataFrame) -> dict[str, Any]:
    """model -> init -> evaluation (and `average`) -> (mean, std over seeds) of the score ×100, where a
    seed's score is the mean of its metrics and its average the mean over evaluations."""
    per_seed = 100 * table.groupby(["model", "init", "evaluation", "seed"], sort=False)["value"].mean()
    averages = per_seed.groupby(["model", "init", "seed"], sort=False).mean()
    spread: dict[str, Any] = {}
    for frame, by in ((per_seed, ["model", "init", "evaluation"]), (averages, ["model", "init"])):
        for key, values in frame.groupby(level=by, sort=False):
            model, init, evaluation = (*key, "average") if len(key) == 2 else key
            std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            spread.setdefault(model, {}).setdefault(init, {})[evaluation] = (float(np.mean(values)), std)
    return spread


def differences(scored: Scored, a: tuple[str, str], b: tuple[str, str], seed: int) -> dict[str, Difference]:
    """(model, init) `a` against `b` on every evaluation and on the average, paired over dev examples."""
    return compare(scored.of(*a), scored.of(*b), scored.labels, seed)


Runs = dict[tuple[str, str], dict[str, np.ndarray]]  # (model, init) -> evaluation -> [seeds, examples]


def read_aligned(aligned: pd.DataFrame) -> tuple[Runs, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`data/evaluate/predictions.parquet` read back: every run's predictions, and the labels and idx
    of every evaluation."""
    runs: Runs = {}
    labels: dict[str, np.ndarray] = {}
    idx: dict[str, np.ndarray] = {}
    for (model, init, key), frame in aligned.groupby(["model", "init", "evaluation"], sort=False):
        frame = frame.sort_values(["seed", "idx"], kind="stable")
        first = frame[frame["seed"] == frame["seed"].iloc[0]]
        idx[key], labels[key] = first["idx"].to_numpy(), first["label"].to_numpy()
        runs.setdefault((model, init), {})[key] = frame["prediction"].to_numpy().reshape(-1, len(first))
    return runs, labels, idx


def glue_metrics(
    medians: dict[str, Any], spread: dict[str, Any], versus_scratch: dict[str, dict[str, Difference]]
) -> dict[str, Any]:
    """`metrics/glue.json` (×100, unrounded: `dvc metrics show` rounds for display). Per model and init
    each evaluation's score (median over seeds) and the GLUE average, their mean and std over seeds; and
    Δ = pretrained − scratch with its 95 % interval, verdict and detectable effect."""
    out: dict[str, Any] = {}
    for model, inits in medians.items():
        out[model] = {}
        for init, evaluations in inits.items():
            row = {key: 100 * float(np.mean(list(m.values()))) for key, m in evaluations.items()}
            out[model][init] = {**row, "average": 100 * glue_average(evaluations)}
            out[model][f"{init}_mean"] = {k: mean for k, (mean, _) in spread[model][init].items()}
            out[model][f"{init}_std"] = {k: std for k, (_, std) in spread[model][init].items()}
        found = versus_scratch[model]
        out[model]["delta"] = {k: d.delta for k, d in found.items()}
        out[model]["delta_low"] = {k: d.low for k, d in found.items()}
        out[model]["delta_high"] = {k: d.high for k, d in found.items()}
        out[model]["verdict"] = {k: d.verdict for k, d in found.items()}
        out[model]["delta_detectable"] = {k: d.detectable for k, d in found.items()}
    return out


def title(key: str) -> str:
    return "Average" if key == "average" else evaluation_title(key)


def interval(d: Difference) -> str:
    return f"{d.delta:+.1f} [{d.low:+.1f}, {d.high:+.1f}]"


def verdict_cell(d: Difference) -> str:
    return f"{interval(d)} **{d.verdict}**" if d.verdict != "within noise" else f"{interval(d)} within noise"


def names(keys: list[str]) -> str:
    return ", ".join(title(k) for k in keys)


def in_short(
    summary: dict[str, Any],
    versus_scratch: dict[str, dict[str, Difference]],
    best: str,
    versus_best: dict[str, Difference],
) -> list[str]:
    """What the verdicts support, and nothing more."""
    lines = []
    for model, found in versus_scratch.items():
        by_verdict = {v: [k for k, d in found.items() if k != "average" and d.verdict == v] for v in VERDICTS}
        average = found["average"]
        if average.verdict == "within noise":
            head = (
                f"no difference from scratch on the GLUE average beyond noise ({interval(average)}; "
                f"these dev sets and seeds find ±{average.detectable:.1f} or more 80 % of the time)"
            )
        else:
            head = f"**{average.verdict}** than scratch on the GLUE average ({interval(average)})"
        parts = [f"{verdict} on {names(keys)}" for verdict, keys in by_verdict.items() if keys]
        lines.append(f"- **{model}** pretrained: {head}; per task: {'; '.join(parts)}.")
    if versus_best:
        against = "; ".join(f"vs {other} {verdict_cell(d)}" for other, d in versus_best.items())
        if all(d.verdict == "better" for d in versus_best.values()):
            lines.append(
                f"- Best pretrained model: **{best}**, above every other on the average ({against})."
            )
        else:
            tied = [other for other, d in versus_best.items() if d.verdict != "better"]
            lines.append(
                f"- Highest pretrained average: {best} ({summary[best]['pretrained']['average']:.1f}), "
                f"but not clearly above {', '.join(tied)} ({against}): no best model can be named."
            )
    count = sum(len(found) for found in versus_scratch.values()) + len(versus_best)
    lines.append(
        f"- {count} comparisons at 95 % confidence each: about {count / 20:.1f} of their verdicts can be "
        "wrong by chance alone."
    )
    return lines


def report(
    params: FinetuneSections,
    scored: Scored,
    medians: dict[str, Any],
    summary: dict[str, Any],
    versus_scratch: dict[str, dict[str, Difference]],
    best: str,
    versus_best: dict[str, Difference],
) -> str:
    table = scored.table
    evaluations = list(scored.labels)
    metric_names = {
        key: "/".join(METRIC_NAMES[m] for m in table[table["evaluation"] == key]["metric"].unique())
        for key in evaluations
    }
    seeds = ", ".join(map(str, params.finetune.seeds))
    lines = ["# GLUE results", ""]
    if params.glue.synthetic:
        lines += [
            "> **Synthetic data.** These tasks were generated by the `sample` stage in the GLUE file layout "
            "from the project's own made-up language; they are not GLUE, and the numbers say nothing about "
            "GLUE itself.",
            "",
        ]
    lines += [
        f"Validation scores ×100: the median over seeds {seeds} (`finetune.seeds`), then (mean ± std) over "
        "the seeds. A task with two metrics shows their mean (each metric is in the seeds table below). "
        "**Average** is the GLUE leaderboard's: the mean over evaluations (MNLI-m and MNLI-mm separately). "
        "*scratch* is the same architecture fine-tuned the same way from a random initialisation. "
        f"Δ = pretrained − scratch [95 % interval] and its verdict, from a {METHOD}: the same resampled dev "
        "examples for both inits and all seeds; `better`/`worse` when the interval excludes 0.",
        "",
    ]
    method = params.finetune.method
    if method != "full":
        trains = "only the head trains" if method == "frozen" else "only its weights and the head train"
        same = "" if method == "frozen" else f", with the same `{method}` weights trained"
        lines += [
            f"Fine-tuning method: `{method}` (`finetune.method`): the pretrained weights stay fixed and "
            f"{trains}. *scratch* is then a random model, frozen the same way{same}: Δ says what the "
            "pretrained weights give the method, not what a whole model fine-tuned from scratch reaches.",
            "",
        ]
    lines += [
        "| Model | Init | "
        + " | ".join(f"{title(k)} {metric_names[k]}" for k in evaluations)
        + " | Average |",
        "|---|---|" + "---:|" * (len(evaluations) + 1),
    ]
    for model in medians:
        variant = params.models[model]
        trains = "" if method == "full" else f"; {method}: {weights_trained(summary[model]['weights'])}"
        student = params.student(model)
        distilled = f"; distilled from {student.teacher}" if student is not None else ""
        label = f"{model} ({variant.arch}, {variant.objective}{distilled}{trains})"
        for init in INITS:
            cells = [
                f"{summary[model][init][k]:.1f} ({summary[model][f'{init}_mean'][k]:.1f} ± "
                f"{summary[model][f'{init}_std'][k]:.1f})"
                for k in [*evaluations, "average"]
            ]
            lines.append(f"| {label if init == 'pretrained' else ''} | {init} | {' | '.join(cells)} |")
        found = versus_scratch[model]
        lines.append(f"| | Δ | {' | '.join(verdict_cell(found[k]) for k in [*evaluations, 'average'])} |")
    lines += ["", "## In short", "", *in_short(summary, versus_scratch, best, versus_best), ""]
    lines += [
        "## Every seed",
        "",
        "| Model | Init | Evaluation | Metric | "
        + " | ".join(f"seed {s}" for s in params.finetune.seeds)
        + " | median |",
        "|---|---|---|---|" + "---:|" * (len(params.finetune.seeds) + 1),
    ]
    for (model, init, evaluation, metric), group in table.groupby(
        ["model", "init", "evaluation", "metric"], sort=False
    ):
        values = group.set_index("seed")["value"]
        lines.append(
            f"| {model} | {init} | {evaluation_title(evaluation)} | {METRIC_NAMES[metric]} | "
            + " | ".join(f"{100 * values[s]:.1f}" for s in params.finetune.seeds)
            + f" | {100 * medians[model][init][evaluation][metric]:.1f} |"
        )
    lines += [
        "",
        "Per-seed values are in `reports/glue.csv`; predictions in `data/finetune/` and, aligned by "
        "example, in `data/evaluate/predictions.parquet`.",
        "",
    ]
    return "\n".join(lines)


def weight_counts(params: FinetuneSections, model: str) -> dict[str, int]:
    """{"trained", "total"}: the weights the fine-tuning method trains of the model and its head, and
    all of them, as its first task's summary counts them (metrics/glue.json: `weights`)."""
    path = finetune_dir(model, params.glue.tasks[0], "pretrained") / "summary.json"
    summary = read_json(path, finetune_stage(model))
    return {"trained": summary["trained_parameters"], "total": summary["total_parameters"]}


def weights_trained(weights: dict[str, int]) -> str:
    """`1.1 k of 29.9 k weights trained (3.6 %)`."""
    trained, total = weights["trained"], weights["total"]
    return f"{count(trained)} of {count(total)} weights trained ({100 * trained / total:.3g} %)"


def count(n: int) -> str:
    """A parameter count as the papers print it: 355.0 M, 0.8 M; 29.9 k below 0.1 M."""
    return f"{n / 1e6:.1f} M" if n >= 1e5 else f"{n / 1e3:.1f} k"


def bar_figure(summary: dict[str, Any], synthetic: bool) -> Any:
    """Grouped bars per evaluation: a hue per model, scratch lighter and hatched; error bars are the
    standard deviation over seeds; the legend below the axes, a column per model, never over a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(next(iter(summary.values()))["pretrained"])
    bars = [(model, init) for model in summary for init in INITS]
    colors = plt.get_cmap("tab10").colors
    size = (max(6, 1.2 * len(keys) * len(bars) / 4), 4 + 0.25 * len(INITS))
    fig, ax = plt.subplots(figsize=size, dpi=100, layout="constrained")
    width = 0.8 / len(bars)
    for i, (model, init) in enumerate(bars):
        scratch = init == "scratch"
        ax.bar(
            np.arange(len(keys)) + i * width - 0.4 + width / 2,
            [summary[model][init][k] for k in keys],
            width,
            yerr=[summary[model][f"{init}_std"][k] for k in keys],
            capsize=2,
            label=f"{model} {init}",
            color=colors[list(summary).index(model) % len(colors)],
            alpha=0.45 if scratch else 1.0,
            hatch="//" if scratch else None,
            edgecolor="white" if scratch else None,
        )
    ax.set_xticks(np.arange(len(keys)), [title(k) for k in keys])
    ax.set_ylabel("score ×100 (median; bars: std over seeds)")
    ax.set_title("GLUE validation" + (" (synthetic tasks)" if synthetic else ""))
    fig.legend(loc="outside lower center", fontsize="small", ncols=len(summary))
    return fig


def bar_chart(summary: dict[str, Any], synthetic: bool) -> bytes:
    """`bar_figure` as PNG bytes."""
    import io

    import matplotlib.pyplot as plt

    fig = bar_figure(summary, synthetic)
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})  # no version stamp: same bytes
    plt.close(fig)
    return png.getvalue()


def aligned_predictions(scored: Scored, seeds: list[int]) -> pd.DataFrame:
    """Every prediction with its label, one row per (model, init, evaluation, seed, example): what a
    sweep compares its points with (`flows.ablation`)."""
    frames = [
        pd.DataFrame(
            {
                "model": model,
                "init": init,
                "evaluation": key,
                "seed": np.repeat(seeds, len(scored.idx[key])),
                "idx": np.tile(scored.idx[key], len(seeds)),
                "label": np.tile(scored.labels[key], len(seeds)).astype(float),
                "prediction": predictions.ravel().astype(float),
            }
        )
        for (model, init, key), predictions in scored.predictions.items()
    ]
    return pd.concat(frames, ignore_index=True)


@dataclass
class Evaluation:
    """What the stage writes, all computed before the first file: a failure leaves no partial outputs."""

    scored: Scored
    summary: dict[str, Any]  # metrics/glue.json
    versus_scratch: dict[str, dict[str, Difference]]
    report: str
    chart: bytes
    plot: pd.DataFrame
    aligned: pd.DataFrame


def evaluate(params: FinetuneSections) -> Evaluation:
    """Every fine-tune scored from its predictions, each model against its scratch baseline and the
    best model against the others, the report and the chart."""
    if not params.models:
        raise StageError("params.yaml: models: no models to evaluate")
    scored = collect(params)
    medians = summarize(scored.table)
    versus_scratch = {
        model: differences(scored, (model, "pretrained"), (model, "scratch"), params.seed)
        for model in params.models
    }
    summary = glue_metrics(medians, seed_spread(scored.table), versus_scratch)
    for model in summary:  # what the fine-tuning method trains of the model and its head
        summary[model]["weights"] = weight_counts(params, model)
    best = max(summary, key=lambda m: summary[m]["pretrained"]["average"])
    versus_best = {
        other: differences(scored, (best, "pretrained"), (other, "pretrained"), params.seed)["average"]
        for other in summary
        if other != best
    }
    plot = pd.DataFrame(
        [
            {"run": f"{model}/{init}/{title(key)}", "score": value}
            for model, inits in summary.items()
            for init in INITS
            for key, value in inits[init].items()
        ]
    )
    return Evaluation(
        scored,
        summary,
        versus_scratch,
        report(params, scored, medians, summary, versus_scratch, best, versus_best),
        bar_chart(summary, params.glue.synthetic),
        plot,
        aligned_predictions(scored, params.finetune.seeds),
    )


def write_outputs(evaluation: Evaluation) -> None:
    """The table of every seed, the report, the chart, the plot, the aligned predictions, the metrics."""
    with atomic_file(GLUE_TABLE) as handle:
        evaluation.scored.table.to_csv(handle, index=False)
    with atomic_file(GLUE_REPORT) as handle:
        handle.write(evaluation.report)
    with atomic_file(GLUE_CHART, "wb") as handle:
        handle.write(evaluation.chart)
    with atomic_file(GLUE_PLOT) as handle:
        evaluation.plot.to_csv(handle, index=False)
    with atomic_file(PREDICTIONS, "wb") as handle:
        evaluation.aligned.to_parquet(handle, index=False)
    write_json(GLUE_METRICS, evaluation.summary)
