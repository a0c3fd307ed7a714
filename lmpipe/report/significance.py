"""Is a difference between two sets of fine-tunes real? A paired bootstrap over the dev examples.

Two systems A and B (pretrained and scratch; a sweep point and its baseline) are each fine-tuned with
the same seeds and predict the same dev examples. An evaluation's score is the one the report shows:
per metric the median over seeds, then the mean over the task's metrics. The difference
Δ = score(A) − score(B) gets a 95 % percentile interval from `scipy.stats.bootstrap` over example indices:
the dev examples are resampled with replacement, the same examples for A and B and for every seed, so
the interval holds what the choice of dev examples can change, with the seeds pooled by their median.
The verdict is `better` when the interval lies above zero, `worse` below it, else `within noise`. The
GLUE average's interval comes from the evaluations' bootstrap distributions (independent dev sets,
resampled independently), averaged draw by draw. A `within noise` verdict is read with the comparison's
detectable effect: the smallest |Δ| it calls `better` or `worse` 80 % of the time, (z₀.₉₇₅ + z₀.₈) ≈ 2.8
bootstrap standard errors (a normal approximation); an effect below it needs more dev examples or seeds.

The metrics are vectorised over resamples; on one resample they equal scikit-learn's and SciPy's
(`lmpipe.glue.tasks.scores`), which the tests check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap, norm

from lmpipe.glue.tasks import TASKS, GlueTask

CONFIDENCE = 0.95
RESAMPLES = 9999  # scipy's default
BATCH = 250  # resamples evaluated at once: bounds memory on the larger dev sets
METHOD = "paired bootstrap over dev examples (scipy.stats.bootstrap, percentile, 9,999 resamples)"
VERDICTS = ("better", "worse", "within noise")
POWER = 0.8  # of the detectable effect
# the detectable effect in standard errors: (z₀.₉₇₅ + z₀.₈) ≈ 2.8
Z_DETECTABLE = float(norm.ppf(1 - (1 - CONFIDENCE) / 2) + norm.ppf(POWER))


@dataclass(frozen=True)
class Difference:
    """A − B in score points ×100, its 95 % interval and what the interval says."""

    delta: float
    low: float
    high: float
    distribution: np.ndarray  # the bootstrap distribution of Δ (×100), for averaging evaluations

    @property
    def verdict(self) -> str:
        return verdict(self.low, self.high)

    @property
    def detectable(self) -> float:
        """The smallest |Δ| this comparison finds (`better`/`worse`) with 80 % power: (z₀.₉₇₅ + z₀.₈)
        bootstrap standard errors."""
        return float(Z_DETECTABLE * np.std(self.distribution, ddof=1))


def verdict(low: float, high: float) -> str:
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "within noise"


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's zero_division)."""
    safe = np.where(denominator == 0, 1, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    return _ratio(np.sum(x * y, axis=-1), np.sqrt(np.sum(x * x, axis=-1) * np.sum(y * y, axis=-1)))


def _ranks(values: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The average ranks (as `scipy.stats.rankdata`) of `values[draws]` within each row of draws, by
    counting how often each distinct value was drawn: linear in the examples, no sort per resample."""
    distinct, inverse = np.unique(values, return_inverse=True)
    drawn = inverse[draws]
    rows, k = drawn.shape[0], len(distinct)
    counts = np.bincount((drawn + k * np.arange(rows)[:, None]).ravel(), minlength=rows * k)
    counts = counts.reshape(rows, k)
    rank = np.cumsum(counts, axis=1) - counts + (counts + 1) / 2
    return np.take_along_axis(rank, drawn, axis=1)


def metric(name: str, predictions: np.ndarray, labels: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """One GLUE metric of one seed's predictions on each resample: `draws` [resamples, n] holds the
    indices of the examples drawn (`np.arange(n)[None]` is the dev set itself)."""
    if name == "spearmanr":  # Pearson of the average ranks, as scipy.stats.spearmanr
        return _pearson(_ranks(predictions, draws), _ranks(labels, draws))
    x, y = predictions[draws], labels[draws]
    if name == "accuracy":
        return np.mean(x == y, axis=-1)
    if name == "pearson":
        return _pearson(x.astype(float), y.astype(float))
    positive, truth = x == 1, y == 1
    tp = np.sum(positive & truth, axis=-1).astype(float)
    fp = np.sum(positive & ~truth, axis=-1).astype(float)
    fn = np.sum(~positive & truth, axis=-1).astype(float)
    tn = np.sum(~positive & ~truth, axis=-1).astype(float)
    if name == "f1":  # of the positive class
        return _ratio(2 * tp, 2 * tp + fp + fn)
    if name == "matthews_correlation":
        return _ratio(tp * tn - fp * fn, np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
    raise ValueError(f"unknown metric '{name}'")


def score(task: GlueTask, predictions: np.ndarray, labels: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The evaluation's score as the report gives it, on each resample, from predictions [seeds, n]:
    per metric the median over seeds, then the mean over the task's metrics. A fraction."""
    per_metric = [
        np.median([metric(m, seed_predictions, labels, draws) for seed_predictions in predictions], axis=0)
        for m in task.metrics
    ]
    return np.mean(per_metric, axis=0)


def paired_difference(
    task: GlueTask, a: np.ndarray, b: np.ndarray, labels: np.ndarray, seed: int = 0
) -> Difference:
    """Δ = score(a) − score(b) ×100 with its interval; `a` and `b` are [seeds, examples] predictions of
    the same examples, in the order of `labels`."""
    a, b, labels = np.asarray(a), np.asarray(b), np.asarray(labels)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] != len(labels):
        raise ValueError(f"{task.name}: predictions {a.shape} and {b.shape} for {len(labels)} labels")
    whole = np.arange(len(labels))[None]
    delta = 100 * float(score(task, a, labels, whole)[0] - score(task, b, labels, whole)[0])
    if np.array_equal(a, b):  # nothing to resample: every draw is exactly 0
        return Difference(delta, 0.0, 0.0, np.zeros(RESAMPLES))

    def statistic(draws: np.ndarray, axis: int = -1) -> np.ndarray:
        # the same drawn examples for a, b and every seed: the pairing
        return 100 * (score(task, a, labels, draws) - score(task, b, labels, draws))

    # scipy resamples the example indices; the statistic looks the examples up
    result = bootstrap(
        (np.arange(len(labels)),),
        statistic,
        vectorized=True,
        axis=-1,
        n_resamples=RESAMPLES,
        batch=BATCH,
        confidence_level=CONFIDENCE,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    interval = result.confidence_interval
    return Difference(delta, float(interval.low), float(interval.high), result.bootstrap_distribution)


def average_difference(differences: Sequence[Difference]) -> Difference:
    """Δ of the GLUE average (the mean over evaluations) with its percentile interval: the evaluations'
    dev sets are independent, so their bootstrap draws are averaged draw by draw."""
    if not differences:
        raise ValueError("no evaluations to average")
    draws = np.mean([d.distribution for d in differences], axis=0)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Difference(float(np.mean([d.delta for d in differences])), float(low), float(high), draws)


def compare(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], labels: Mapping[str, np.ndarray], seed: int = 0
) -> dict[str, Difference]:
    """System `a` against `b` on every evaluation (key -> [seeds, examples] predictions in the order of
    `labels[key]`; 'mnli-m' is MNLI's matched set) and on the GLUE average (key `average`)."""
    found = {
        key: paired_difference(TASKS[key.partition("-")[0]], a[key], b[key], truth, seed)
        for key, truth in labels.items()
    }
    return {**found, "average": average_difference(list(found.values()))}
