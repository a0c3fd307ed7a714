"""Stage `evaluate`: GLUE scores of every fine-tune, the pretrained-minus-scratch differences, the report.

Scores are recomputed from the prediction files against the labels in `data/glue` (never trusted from
the fine-tune's own log). Per (model, init, evaluation, metric) the median over seeds; an evaluation's
score is the mean of its metrics; the average is the GLUE leaderboard's (the mean over evaluations,
MNLI matched and mismatched counted separately). Writes `metrics/glue.json` (DVC metrics, ×100),
`reports/glue.md`, `reports/glue.csv` (every seed and metric), `plots/glue.csv` and `reports/glue.png`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stages.common import StageError, atomic_file, log, read_json, run_main, write_json
from stages.finetune import predictions_sha256, stage_name
from stages.glue import TASKS, GlueTask, glue_average, scores
from stages.params import Params, load_params
from stages.tracking import stage_run

FINETUNE = Path("data/finetune")
GLUE = Path("data/glue")
INITS = ("pretrained", "scratch")
METRIC_NAMES = {
    "accuracy": "Acc",
    "f1": "F1",
    "matthews_correlation": "MCC",
    "pearson": "Pearson",
    "spearmanr": "Spearman",
}
TASK_NAMES = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "stsb": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}


def evaluation_key(task: GlueTask, split: str) -> str:
    """'sst2'; MNLI's two validation sets are 'mnli-m' and 'mnli-mm'."""
    if split == "validation":
        return task.name
    return f"{task.name}-{'mm' if split.endswith('mismatched') else 'm'}"


def evaluation_title(key: str) -> str:
    task, _, suffix = key.partition("-")
    return TASK_NAMES[task] + (f"-{suffix}" if suffix else "")


def score_predictions(path: Path, task: GlueTask, split: str, truth: pd.DataFrame) -> dict[str, float]:
    """One seed's predictions scored against `truth`, the split's `idx, label` from `data/glue`."""
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
    return scores(task, joined["prediction"].to_numpy(), joined["label"].to_numpy())


def collect(params: Params) -> pd.DataFrame:
    """Long table: model, init, task, evaluation, seed, metric, value (fractions)."""
    # every split's labels read once, however many models, inits and seeds are scored on them
    truth = {
        (name, split): pd.read_parquet(GLUE / name / f"{split}.parquet", columns=["idx", "label"])
        for name in params.glue.tasks
        for split in TASKS[name].eval_splits
    }
    rows = []
    for model in params.models:
        for name in params.glue.tasks:
            task = TASKS[name]
            for init in INITS:
                run_dir = FINETUNE / model / name / init
                summary = read_json(run_dir / "summary.json", stage_name(model, name, init))
                missing = [s for s in params.finetune.seeds if str(s) not in summary["seeds"]]
                if missing:
                    raise StageError(
                        f"{run_dir}/summary.json: no run for seed(s) {missing} of finetune.seeds; "
                        "re-run the fine-tuning stages (dvc repro)"
                    )
                for seed in params.finetune.seeds:
                    for split in task.eval_splits:
                        found = score_predictions(
                            run_dir / f"seed{seed}" / f"{split}.parquet", task, split, truth[(name, split)]
                        )
                        for metric, value in found.items():
                            rows.append((model, init, name, evaluation_key(task, split), seed, metric, value))
    return pd.DataFrame(rows, columns=["model", "init", "task", "evaluation", "seed", "metric", "value"])


def log_to_finetune_runs(table: pd.DataFrame, experiment: str) -> None:
    """Each fine-tune's MLflow run gets its own GLUE scores (`<evaluation>/<metric>`), so the runs of
    one (model, task, seed) compare in the MLflow UI as they do in the report. The run is the one
    tagged with the digest of the very predictions scored."""
    from stages.tracking import find_run, log_to_run

    missing = 0
    for (model, init, name, seed), rows in table.groupby(["model", "init", "task", "seed"], sort=False):
        tags = {
            "stage": "finetune",
            "model": model,
            "task": name,
            "init": init,
            "seed": str(seed),
            "predictions_sha256": predictions_sha256(FINETUNE / model / name / init / f"seed{seed}"),
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


def summarize(table: pd.DataFrame) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """model -> init -> evaluation -> metric -> median over seeds."""
    medians: dict[str, Any] = {}
    grouped = table.groupby(["model", "init", "evaluation", "metric"], sort=False)["value"]
    for (model, init, evaluation, metric), values in grouped:
        medians.setdefault(model, {}).setdefault(init, {}).setdefault(evaluation, {})[metric] = float(
            statistics.median(values)
        )
    return medians


def glue_metrics(medians: dict[str, Any]) -> dict[str, Any]:
    """`metrics/glue.json`: per model and init, each evaluation's score and the GLUE average, ×100;
    and their pretrained-minus-scratch differences. Unrounded: `dvc metrics show` rounds for display."""
    out: dict[str, Any] = {}
    for model, inits in medians.items():
        out[model] = {}
        for init, evaluations in inits.items():
            row = {key: 100 * float(np.mean(list(m.values()))) for key, m in evaluations.items()}
            out[model][init] = {**row, "average": 100 * glue_average(evaluations)}
        out[model]["delta"] = {k: v - out[model]["scratch"][k] for k, v in out[model]["pretrained"].items()}
    return out


def cell(metrics: dict[str, float]) -> str:
    return "/".join(f"{100 * v:.1f}" for v in metrics.values())


def report(params: Params, table: pd.DataFrame, medians: dict[str, Any], summary: dict[str, Any]) -> str:
    evaluations = list(dict.fromkeys(table["evaluation"]))
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
        f"Validation scores ×100, each the median over seeds {seeds} (`finetune.seeds`). Tasks with two "
        "metrics show both; a task's score is their mean. **Average** is the GLUE leaderboard's: the mean "
        "over evaluations (MNLI-m and MNLI-mm separately) of each evaluation's score. *scratch* is the same "
        "architecture fine-tuned the same way from a random initialisation; Δ = pretrained − scratch.",
        "",
        "| Model | Init | "
        + " | ".join(f"{evaluation_title(k)} {metric_names[k]}" for k in evaluations)
        + " | Average |",
        "|---|---|" + "---:|" * (len(evaluations) + 1),
    ]
    for model, inits in medians.items():
        variant = params.models[model]
        label = f"{model} ({variant.arch}, {variant.objective})"
        for init in INITS:
            cells = [cell(inits[init][k]) for k in evaluations]
            lines.append(
                f"| {label if init == 'pretrained' else ''} | {init} | {' | '.join(cells)} | "
                f"{summary[model][init]['average']:.1f} |"
            )
        deltas = [f"{summary[model]['delta'][k]:+.1f}" for k in evaluations]
        lines.append(f"| | Δ | {' | '.join(deltas)} | **{summary[model]['delta']['average']:+.1f}** |")
    best = max(medians, key=lambda m: summary[m]["pretrained"]["average"])
    helped = max(medians, key=lambda m: summary[m]["delta"]["average"])
    lines += ["", "## In short", ""]
    for model in medians:
        gains = sum(summary[model]["delta"][k] > 0 for k in evaluations)
        lines.append(
            f"- **{model}**: pretraining changed the average by {summary[model]['delta']['average']:+.1f} "
            f"points and helped on {gains} of {len(evaluations)} evaluations."
        )
    variant = params.models[best]
    lines += [
        f"- Best pretrained model: **{best}** ({variant.arch} with {variant.objective}), average "
        f"{summary[best]['pretrained']['average']:.1f}.",
        f"- Largest gain from pretraining: **{helped}** ({summary[helped]['delta']['average']:+.1f}).",
        "",
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
    lines += ["", "Per-seed values are in `reports/glue.csv`; predictions in `data/finetune/`.", ""]
    return "\n".join(lines)


def bar_chart(summary: dict[str, Any], synthetic: bool) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in next(iter(summary.values()))["pretrained"]]
    bars = [(f"{model} {init}", summary[model][init]) for model in summary for init in INITS]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(keys) * len(bars) / 4), 4), dpi=100)
    width = 0.8 / len(bars)
    for i, (label, row) in enumerate(bars):
        ax.bar(
            np.arange(len(keys)) + i * width - 0.4 + width / 2,
            [row[k] for k in keys],
            width,
            label=label,
            hatch="//" if label.endswith("scratch") else None,
        )
    ax.set_xticks(np.arange(len(keys)), [evaluation_title(k) if k != "average" else "Average" for k in keys])
    ax.set_ylabel("score ×100 (median over seeds)")
    ax.set_title("GLUE validation" + (" (synthetic tasks)" if synthetic else ""))
    ax.legend(fontsize="small", ncols=2)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})  # no version stamp: same bytes
    plt.close(fig)
    return png.getvalue()


def main() -> None:
    params = load_params()
    with stage_run(
        "evaluate",
        params.tracking.experiment,
        {
            "glue.tasks": params.glue.tasks,
            "finetune.seeds": params.finetune.seeds,
            "models": list(params.models),
        },
        {"data.synthetic": params.glue.synthetic},
    ) as run:
        if not params.models:
            raise StageError("params.yaml: models: no models to evaluate")
        table = collect(params)
        medians = summarize(table)
        summary = glue_metrics(medians)
        text = report(params, table, medians, summary)
        png = bar_chart(summary, params.glue.synthetic)
        plot_rows = [
            {"run": f"{model}/{init}/{evaluation_title(k) if k != 'average' else 'Average'}", "score": v}
            for model, inits in summary.items()
            for init in INITS
            for k, v in inits[init].items()
        ]
        # everything is computed before the first file is written: a failure leaves no partial outputs
        with atomic_file(Path("reports/glue.csv")) as handle:
            table.to_csv(handle, index=False)
        with atomic_file(Path("reports/glue.md")) as handle:
            handle.write(text)
        with atomic_file(Path("reports/glue.png"), "wb") as handle:
            handle.write(png)
        with atomic_file(Path("plots/glue.csv")) as handle:
            pd.DataFrame(plot_rows).to_csv(handle, index=False)
        write_json(Path("metrics/glue.json"), summary)
        run.log_metrics(summary)
        log_to_finetune_runs(table, params.tracking.experiment)
        for path in ("metrics/glue.json", "reports/glue.md", "reports/glue.csv", "reports/glue.png"):
            run.log_artifact(path)
        for model in summary:
            log.info(
                "evaluate: %s average %.1f pretrained, %.1f scratch (%+.1f)",
                model,
                summary[model]["pretrained"]["average"],
                summary[model]["scratch"]["average"],
                summary[model]["delta"]["average"],
            )
        log.info("evaluate: report in reports/glue.md")


if __name__ == "__main__":
    run_main(main)
