"""GLUE's metrics, as the benchmark defines them, and its leaderboard average."""

from __future__ import annotations

import numpy as np

from lmpipe.glue.tasks import GlueTask


def scores(spec: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's metrics exactly as GLUE defines them (scikit-learn / scipy), as fractions."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    if len(predictions) != len(labels) or len(labels) == 0:
        raise ValueError(f"{spec.name}: {len(predictions)} predictions for {len(labels)} labels")
    compute = {
        "accuracy": lambda: accuracy_score(labels, predictions),
        "f1": lambda: f1_score(labels, predictions),  # of the positive class (1), as GLUE reports it
        "matthews_correlation": lambda: matthews_corrcoef(labels, predictions),
        "pearson": lambda: pearsonr(predictions, labels)[0],
        "spearmanr": lambda: spearmanr(predictions, labels)[0],
    }
    return {metric: float(compute[metric]()) for metric in spec.metrics}


def glue_average(results: dict[str, dict[str, float]]) -> float:
    """The leaderboard's average: the mean over evaluations (MNLI-m and MNLI-mm count separately) of the
    mean of each evaluation's metrics."""
    if not results:
        raise ValueError("no task results to average")
    return float(np.mean([np.mean(list(metrics.values())) for metrics in results.values()]))
