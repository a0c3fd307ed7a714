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

The metrics are vectorised over resamples: a resample is the dev set with weights (how often each
example was drawn), so its sums are one matrix product for every seed and system. On one resample
they equal scikit-learn's and SciPy's (`lmpipe.glue.tasks.scores`), which the tests check. The
products run on one BLAS thread: summed over another split of the threads they give other float bits,
and the report must not depend on how many stages a flow runs beside it (OMP_NUM_THREADS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import bootstrap, norm
from threadpoolctl import threadpool_limits

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


def _weights(draws: np.ndarray, n: int) -> np.ndarray:
    """[resamples, n]: how often each example was drawn in each resample. A resample's metric is a
    weighted one over the dev set: sums over the drawn examples are these weights times the examples'
    values, one matrix product for every seed, system and metric (no copy of the drawn examples)."""
    rows = draws.shape[0]
    flat = (draws + n * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


def _pearson(n: np.ndarray, x: np.ndarray, y: np.ndarray, xx: np.ndarray, yy: np.ndarray, xy: np.ndarray):
    """Pearson's r of each resample from its `n` examples' weighted sums of x, y, x², y² and xy."""
    return _ratio(xy - x * y / n, np.sqrt((xx - x**2 / n) * (yy - y**2 / n)))


def _ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[resamples, n]: each example's average rank (as `scipy.stats.rankdata`) among the examples
    drawn, from how often each distinct value was drawn: linear in the examples, no sort per
    resample. An example not drawn gets the rank it would have had; its weight is 0."""
    distinct, inverse = np.unique(values, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    if len(distinct) == len(values):  # no ties (a regression's predictions): a value per example
        counts = weights[:, order]
    else:
        starts = np.searchsorted(inverse[order], np.arange(len(distinct)))
        counts = np.add.reduceat(weights[:, order], starts, axis=1)  # [resamples, distinct values]
    rank = np.cumsum(counts, axis=1) - counts + (counts + 1) / 2
    return rank[:, inverse]


class Resamples:
    """One batch of resamples of a dev set: each example's weight (how often it was drawn) in each
    resample, and what the labels give every system and seed compared on it (their ranks, once)."""

    def __init__(self, draws: np.ndarray, labels: np.ndarray) -> None:
        self.labels = labels
        self.weights = _weights(draws, len(labels))
        self.n = self.weights.sum(axis=-1)
        self._label_ranks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def label_ranks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The labels' ranks in each resample, and their weighted sum and sum of squares."""
        if self._label_ranks is None:
            y = _ranks(self.labels, self.weights)
            self._label_ranks = y, (self.weights * y).sum(-1), (self.weights * y * y).sum(-1)
        return self._label_ranks

    def metric(self, name: str, predictions: np.ndarray) -> np.ndarray:
        """[seeds, resamples]: one GLUE metric of each seed's predictions [seeds, n] on each resample."""
        weights, labels, n = self.weights, self.labels, self.n
        if name == "spearmanr":  # Pearson of the average ranks, as scipy.stats.spearmanr
            y, sum_y, sum_yy = self.label_ranks()
            found = []
            for seed_predictions in predictions:
                x = _ranks(seed_predictions, weights)
                wx = weights * x
                found.append(_pearson(n, wx.sum(-1), sum_y, (wx * x).sum(-1), sum_yy, (wx * y).sum(-1)))
            return np.array(found)
        if name == "pearson":
            x, y = predictions.astype(float), labels.astype(float)
            sums = weights @ np.vstack([x, x * x, x * y]).T  # [resamples, 3 * seeds]
            sum_x, sum_xx, sum_xy = np.split(sums.T, 3)
            return _pearson(n, sum_x, weights @ y, sum_xx, weights @ (y * y), sum_xy)
        if name == "accuracy":
            return (weights @ (predictions == labels).T.astype(float)).T / n
        positive, truth = predictions == 1, labels == 1
        cells = [positive & truth, positive & ~truth, ~positive & truth, ~positive & ~truth]
        tp, fp, fn, tn = np.split((weights @ np.vstack(cells).T.astype(float)).T, 4)
        if name == "f1":  # of the positive class
            return _ratio(2 * tp, 2 * tp + fp + fn)
        if name == "matthews_correlation":
            return _ratio(tp * tn - fp * fn, np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
        raise ValueError(f"unknown metric '{name}'")

    def score(self, task: GlueTask, predictions: np.ndarray) -> np.ndarray:
        """`score` of predictions [seeds, n] on these resamples."""
        per_metric = [np.median(self.metric(m, predictions), axis=0) for m in task.metrics]
        return np.mean(per_metric, axis=0)


def metric(name: str, predictions: np.ndarray, labels: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """One GLUE metric of one seed's predictions on each resample: `draws` [resamples, n] holds the
    indices of the examples drawn (`np.arange(n)[None]` is the dev set itself)."""
    return Resamples(draws, labels).metric(name, np.asarray(predictions)[None])[0]


def score(task: GlueTask, predictions: np.ndarray, labels: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The evaluation's score as the report gives it, on each resample, from predictions [seeds, n]:
    per metric the median over seeds, then the mean over the task's metrics. A fraction."""
    return Resamples(draws, labels).score(task, np.asarray(predictions))


def paired_difference(
    task: GlueTask, a: np.ndarray, b: np.ndarray, labels: np.ndarray, seed: int = 0
) -> Difference:
    """Δ = score(a) − score(b) ×100 with its interval; `a` and `b` are [seeds, examples] predictions of
    the same examples, in the order of `labels`."""
    a, b, labels = np.asarray(a), np.asarray(b), np.asarray(labels)
    if a.ndim != 2 or a.shape != b.shape or a.shape[1] != len(labels):
        raise ValueError(f"{task.name}: predictions {a.shape} and {b.shape} for {len(labels)} labels")
    with threadpool_limits(limits=1, user_api="blas"):
        return _paired_difference(task, a, b, labels, seed)


def _paired_difference(
    task: GlueTask, a: np.ndarray, b: np.ndarray, labels: np.ndarray, seed: int
) -> Difference:
    whole = np.arange(len(labels))[None]
    delta = 100 * float(score(task, a, labels, whole)[0] - score(task, b, labels, whole)[0])
    if np.array_equal(a, b):  # nothing to resample: every draw is exactly 0
        return Difference(delta, 0.0, 0.0, np.zeros(RESAMPLES))

    def statistic(draws: np.ndarray, axis: int = -1) -> np.ndarray:
        # the same drawn examples for a, b and every seed: the pairing
        resamples = Resamples(draws, labels)
        return 100 * (resamples.score(task, a) - resamples.score(task, b))

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
