"""`evaluate`: GLUE's metrics from prediction files against the real dev labels, medians over seeds,
the leaderboard average with MNLI-m and MNLI-mm apart, the report, and the scores in MLflow."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from lmpipe.glue.prepare import read_tsv
from lmpipe.glue.tasks import TASKS
from lmpipe.layout import predictions_sha256
from lmpipe.runtime import StageError
from tests.workdir import Workdir

MODELS = {
    "enc": {"arch": "encoder", "objective": "mlm", "preset": "tiny"},
    "dec": {"arch": "decoder", "objective": "clm", "preset": "tiny"},
}
SEEDS = [1, 2, 3]
REAL_TASKS = ["cola", "stsb", "mrpc", "rte"]


def mnli_split(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "idx": np.arange(rows),
            "premise": ["A premise."] * rows,
            "hypothesis": ["A hypothesis."] * rows,
            "label": rng.integers(0, 3, rows),
        }
    )


def predictor(labels: np.ndarray, regression: bool, skill: float, seed: int) -> np.ndarray:
    """Right with probability `skill` (classes), or the label plus noise (regression)."""
    rng = np.random.default_rng(seed)
    if regression:
        return labels + rng.normal(0, 2.0 * (1 - skill), len(labels))
    wrong = (labels + rng.integers(1, 3, len(labels))) % (labels.max() + 1)
    return np.where(rng.random(len(labels)) < skill, labels, wrong)


def finished_run(tags: dict[str, str]) -> str:
    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("lmpipe") or client.get_experiment(
        client.create_experiment("lmpipe")
    )
    run = client.create_run(experiment.experiment_id, tags=tags)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


@pytest.fixture
def scored(workdir: Workdir, glue_dir: Path) -> Workdir:
    """data/glue from the real dev files (and a made-up MNLI), predictions of 2 models × 2 inits × 3
    seeds whose quality depends on all three, and a finished MLflow run for every fine-tune."""
    workdir.set("models", MODELS)
    workdir.set(
        "glue", {"source": "tsv", "path": str(glue_dir), "tasks": [*REAL_TASKS, "mnli"], "synthetic": False}
    )
    workdir.set("finetune.seeds", SEEDS)
    truth = {}
    for name in REAL_TASKS:
        spec = TASKS[name]
        truth[(name, "validation")] = read_tsv(glue_dir / spec.folder / spec.splits["validation"], spec)
    truth[("mnli", "validation_matched")] = mnli_split(300, 0)
    truth[("mnli", "validation_mismatched")] = mnli_split(280, 1)
    for (name, split), frame in truth.items():
        (workdir.path / "data/glue" / name).mkdir(parents=True, exist_ok=True)
        frame.to_parquet(workdir.path / "data/glue" / name / f"{split}.parquet", index=False)
    runs = {}
    for m, model in enumerate(MODELS):
        for i, init in enumerate(["pretrained", "scratch"]):
            for name in [*REAL_TASKS, "mnli"]:
                run_dir = workdir.path / "data/finetune" / model / init / name
                seeds = {}
                for seed in SEEDS:
                    (run_dir / f"seed{seed}").mkdir(parents=True)
                    for split in TASKS[name].eval_splits:
                        frame = truth[(name, split)]
                        labels = frame["label"].to_numpy()
                        skill = (
                            0.55
                            + 0.1 * m
                            + 0.1 * (1 - i)
                            + 0.02 * seed
                            + (0.1 if "mismatched" in split else 0)
                        )
                        predictions = predictor(labels, TASKS[name].is_regression, skill, seed)
                        pd.DataFrame(
                            {"idx": frame["idx"], "label": labels, "prediction": predictions}
                        ).to_parquet(run_dir / f"seed{seed}" / f"{split}.parquet", index=False)
                    tags = {
                        "stage": "finetune",
                        "model": model,
                        "task": name,
                        "init": init,
                        "seed": str(seed),
                    }
                    digest = predictions_sha256(run_dir / f"seed{seed}")
                    runs[(model, init, name, seed)] = finished_run({**tags, "predictions_sha256": digest})
                    finished_run({**tags, "predictions_sha256": "an older run of other predictions"})
                    seeds[str(seed)] = {"predictions_sha256": digest}
                weights = f"weights of {model}" if init == "pretrained" else None
                # the weights full fine-tuning trains: all of them (metrics/glue.json's `weights`)
                counts = {"method": "full", "trained_parameters": 1000, "total_parameters": 1000}
                summary = {"seeds": seeds, "weights_sha256": weights, **counts}
                (run_dir / "summary.json").write_text(json.dumps(summary))
        runs[(model, "pretrain")] = finished_run(
            {"stage": "pretrain", "model": model, "weights_sha256": f"weights of {model}"}
        )
    workdir.truth, workdir.runs = truth, runs
    return workdir


def expected_scores(workdir: Workdir, model: str, init: str, name: str, split: str) -> dict[str, list[float]]:
    """Every seed's metrics straight from scikit-learn / scipy."""
    labels = workdir.truth[(name, split)]["label"].to_numpy()
    found: dict[str, list[float]] = {}
    for seed in SEEDS:
        path = workdir.path / "data/finetune" / model / init / name / f"seed{seed}" / f"{split}.parquet"
        p = pd.read_parquet(path)["prediction"].to_numpy()
        if name == "stsb":
            values = {
                "pearson": scipy.stats.pearsonr(p, labels)[0],
                "spearmanr": scipy.stats.spearmanr(p, labels)[0],
            }
        elif name == "cola":
            values = {"matthews_correlation": matthews_corrcoef(labels, p)}
        elif name == "mrpc":
            values = {"f1": f1_score(labels, p), "accuracy": accuracy_score(labels, p)}
        else:
            values = {"accuracy": accuracy_score(labels, p)}
        for metric, value in values.items():
            found.setdefault(metric, []).append(float(value))
    return found


def test_scores_equal_sklearn_and_scipy_and_the_average_is_the_leaderboards(scored: Workdir) -> None:
    from stages import evaluate

    evaluate.main()
    glue = json.loads((scored.path / "metrics/glue.json").read_text())
    per_seed = pd.read_csv(scored.path / "reports/glue.csv")
    evaluations = {
        "cola": ("cola", "validation"),
        "stsb": ("stsb", "validation"),
        "mrpc": ("mrpc", "validation"),
        "rte": ("rte", "validation"),
        "mnli-m": ("mnli", "validation_matched"),
        "mnli-mm": ("mnli", "validation_mismatched"),
    }
    for model in MODELS:
        for init in ["pretrained", "scratch"]:
            row = glue[model][init]
            for key, (name, split) in evaluations.items():
                expected = expected_scores(scored, model, init, name, split)
                for metric, values in expected.items():
                    logged = per_seed.query(
                        "model == @model and init == @init and evaluation == @key and metric == @metric"
                    ).sort_values("seed")["value"]
                    assert np.abs(logged.to_numpy() - values).max() < 1e-9, (model, init, key, metric)
                medians = [statistics.median(v) for v in expected.values()]
                assert abs(row[key] - 100 * np.mean(medians)) < 1e-9, (model, init, key)
            assert row["mnli-m"] != row["mnli-mm"]  # two evaluations, never pooled
            assert abs(row["average"] - np.mean([row[k] for k in evaluations])) < 1e-9
        for key in [*evaluations, "average"]:
            assert (
                abs(
                    glue[model]["delta"][key] - (glue[model]["pretrained"][key] - glue[model]["scratch"][key])
                )
                < 1e-9
            )
    assert len(per_seed) == len(MODELS) * 2 * len(SEEDS) * 8  # 8 metrics over the 6 evaluations

    report = (scored.path / "reports/glue.md").read_text()
    assert "Synthetic data" not in report
    assert (
        "| Model | Init | CoLA MCC | STS-B Pearson/Spearman | MRPC F1/Acc | RTE Acc | MNLI-m Acc "
        "| MNLI-mm Acc | Average |" in report
    )
    cola = {k: glue["enc"][k]["cola"] for k in ("delta", "delta_low", "delta_high", "verdict")}
    assert cola["delta_low"] <= cola["delta"] <= cola["delta_high"]
    assert (
        f"| | Δ | {cola['delta']:+.1f} [{cola['delta_low']:+.1f}, {cola['delta_high']:+.1f}] "
        f"**{cola['verdict']}** |" in report
    )
    # the planted skills: pretrained beats scratch by 10 points of accuracy on every evaluation
    assert all(v == "better" for model in MODELS for v in glue[model]["verdict"].values())
    assert "**enc** pretrained: **better** than scratch on the GLUE average" in report
    assert "paired bootstrap over dev examples" in report
    spread = per_seed[per_seed["evaluation"] == "rte"].query("model == 'enc' and init == 'scratch'")
    assert glue["enc"]["scratch_std"]["rte"] == pytest.approx(100 * spread["value"].std(ddof=1))
    aligned = pd.read_parquet(scored.path / "data/evaluate/predictions.parquet")
    assert len(aligned) == len(MODELS) * 2 * len(SEEDS) * sum(len(f) for f in scored.truth.values())
    assert (scored.path / "reports/glue.png").read_bytes().startswith(b"\x89PNG")
    plot = pd.read_csv(scored.path / "plots/glue.csv")
    assert len(plot) == len(MODELS) * 2 * 7 and set(plot.columns) == {"run", "score"}


def test_every_fine_tune_run_gets_its_scores_in_mlflow(scored: Workdir) -> None:
    import mlflow

    from stages import evaluate

    evaluate.main()
    per_seed = pd.read_csv(scored.path / "reports/glue.csv")
    client = mlflow.MlflowClient()
    for key, rows in per_seed.groupby(["model", "init", "task", "seed"]):
        metrics = client.get_run(scored.runs[key]).data.metrics
        assert len(metrics) == len(rows)
        for row in rows.itertuples():
            assert metrics[f"{row.evaluation}/{row.metric}"] == pytest.approx(row.value, abs=1e-12)
    experiment = client.get_experiment_by_name("lmpipe")
    (run,) = client.search_runs([experiment.experiment_id], "tags.stage = 'evaluate'", max_results=1)
    assert run.data.metrics["enc.pretrained.average"] == pytest.approx(
        json.loads((scored.path / "metrics/glue.json").read_text())["enc"]["pretrained"]["average"]
    )
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"glue.md", "glue.json", "glue.csv", "glue.png"} <= artifacts
    # the comparison a user came for, on the model's own pretrain run and on the execution's parent
    glue = json.loads((scored.path / "metrics/glue.json").read_text())
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["stage"] == "pipeline"
    for model in MODELS:
        pretrain = client.get_run(scored.runs[(model, "pretrain")]).data
        for task, value in glue[model]["pretrained"].items():
            assert pretrain.metrics[f"glue.{task}"] == pytest.approx(value)
            assert parent.data.metrics[f"{model}.glue.{task}"] == pytest.approx(value)
        for task, value in glue[model]["delta"].items():
            assert pretrain.metrics[f"glue.delta.{task}"] == pytest.approx(value)
            assert pretrain.tags[f"verdict.{task}"] == glue[model]["verdict"][task]
    assert client.get_experiment_by_name("lmpipe").tags["mlflow.experimentKind"] == "custom_model_development"


def test_bad_prediction_files_are_named_and_nothing_is_written(scored: Workdir) -> None:
    from stages import evaluate

    path = scored.path / "data/finetune/dec/scratch/rte/seed2/validation.parquet"
    frame = pd.read_parquet(path)
    frame.loc[5, "idx"] = 9999
    frame.to_parquet(path, index=False)
    with pytest.raises(
        StageError, match=r"seed2/validation.parquet: row 5: idx 9999 is not in data/glue/rte"
    ):
        evaluate.main()
    assert not (scored.path / "metrics/glue.json").exists() and not (scored.path / "reports").exists()

    (scored.path / "data/finetune/enc/scratch/mrpc/summary.json").unlink()
    with pytest.raises(StageError, match=r"enc/scratch/mrpc/summary.json: missing; run the 'finetune@enc'"):
        evaluate.main()


def test_the_chart_s_legend_lies_outside_the_bars() -> None:
    """Three models of two inits on three tasks and the average, bars up to the top: the legend's box
    meets no bar, no error bar and no part of the axes."""
    import matplotlib.pyplot as plt

    from lmpipe.report.glue import bar_figure

    keys = ["cola", "stsb", "mrpc", "average"]
    scores = {init: {k: 95.0 for k in keys} for init in ("pretrained", "scratch")}
    spread = {f"{init}_std": {k: 4.0 for k in keys} for init in ("pretrained", "scratch")}
    summary = {model: scores | spread for model in ("encoder_mlm", "decoder_clm", "encdec_span")}
    fig = bar_figure(summary, synthetic=True)
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    ax = fig.axes[0]
    assert len(fig.legends[0].get_texts()) == 6
    assert not legend.overlaps(ax.get_window_extent())
    assert not legend.overlaps(ax.get_tightbbox())  # tick labels and the axis title too
    plt.close(fig)
