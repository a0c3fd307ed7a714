"""The paired bootstrap: metrics equal scikit-learn's and SciPy's, the interval equals
`scipy.stats.bootstrap` computed with them, and the verdicts say what was planted."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from lmpipe.glue.metrics import scores
from lmpipe.glue.tasks import TASKS
from lmpipe.report import significance
from lmpipe.report.significance import average_difference, metric, paired_difference, score

SIZES = {"cola": 400, "sst2": 300, "mrpc": 250, "stsb": 300, "rte": 277}


def labels_for(name: str, rng: np.random.Generator) -> np.ndarray:
    n = SIZES[name]
    if TASKS[name].is_regression:
        return np.round(rng.uniform(0, 5, n), 1)  # STS-B's grid: many ties, which ranks must handle
    return rng.integers(0, 2, n)


def system(labels: np.ndarray, skill: float, rng: np.random.Generator, seeds: int = 3) -> np.ndarray:
    """[seeds, examples] predictions: right with probability `skill`, or the label plus noise."""
    if labels.dtype.kind == "f":
        return np.round(labels + rng.normal(0, 3 * (1 - skill), (seeds, len(labels))), 2)
    right = rng.random((seeds, len(labels))) < skill
    return np.where(right, labels, 1 - labels)


@pytest.mark.parametrize("name", list(SIZES))
def test_metrics_equal_sklearn_and_scipy_on_the_dev_set_and_on_resamples(name: str) -> None:
    rng = np.random.default_rng(0)
    task, labels = TASKS[name], labels_for(name, rng)
    predictions = system(labels, 0.7, rng)
    whole = np.arange(len(labels))[None]
    draws = np.vstack([whole, rng.integers(0, len(labels), (4, len(labels)))])
    for seed_predictions in predictions:
        for row, drawn in enumerate(draws):
            expected = scores(task, seed_predictions[drawn], labels[drawn])  # sklearn / scipy
            for name_, value in expected.items():
                assert metric(name_, seed_predictions, labels, draws)[row] == pytest.approx(value, abs=1e-12)
    per_seed = [scores(task, p, labels) for p in predictions]
    expected = np.mean([np.median([s[m] for s in per_seed]) for m in task.metrics])
    assert score(task, predictions, labels, whole)[0] == pytest.approx(expected, abs=1e-12)


def test_degenerate_metrics_follow_sklearn_zero_division() -> None:
    labels = np.array([0, 1, 0, 1])
    constant = np.zeros(4, dtype=int)
    whole = np.arange(4)[None]
    for name in ("f1", "matthews_correlation"):
        assert metric(name, constant, labels, whole)[0] == 0.0
    assert scores(TASKS["cola"], constant, labels)["matthews_correlation"] == 0.0


@pytest.mark.parametrize("name", ["rte", "stsb"])
def test_the_interval_is_scipys_paired_bootstrap_of_the_sklearn_scores(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same draws, same statistic from sklearn/scipy one resample at a time: the same interval."""
    monkeypatch.setattr(significance, "RESAMPLES", 300)
    rng = np.random.default_rng(1)
    task, labels = TASKS[name], labels_for(name, rng)
    a, b = system(labels, 0.75, rng), system(labels, 0.7, rng)
    found = paired_difference(task, a, b, labels, seed=7)

    def reference(drawn: np.ndarray) -> float:
        """Δ on the examples `drawn`, from sklearn/scipy one seed at a time."""

        def one(predictions: np.ndarray) -> float:
            per_seed = [scores(task, p[drawn], labels[drawn]) for p in predictions]
            return float(np.mean([np.median([s[m] for s in per_seed]) for m in task.metrics]))

        return 100 * (one(a) - one(b))

    # scipy draws the example indices (as its paired mode does) and calls the reference on each draw
    expected = scipy.stats.bootstrap(
        (np.arange(len(labels)),),
        reference,
        vectorized=False,
        n_resamples=300,
        batch=significance.BATCH,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(7),
    )
    assert found.delta == pytest.approx(reference(np.arange(len(labels))), abs=1e-9)
    assert found.low == pytest.approx(expected.confidence_interval.low, abs=1e-9)
    assert found.high == pytest.approx(expected.confidence_interval.high, abs=1e-9)


@pytest.mark.parametrize("name", list(SIZES))
def test_planted_difference_is_better_identical_is_within_noise_swapped_is_worse(name: str) -> None:
    rng = np.random.default_rng(2)
    task, labels = TASKS[name], labels_for(name, rng)
    strong, weak = system(labels, 0.9, rng), system(labels, 0.6, rng)
    better = paired_difference(task, strong, weak, labels)
    assert better.verdict == "better" and 0 < better.low <= better.delta <= better.high
    same = paired_difference(task, strong, strong.copy(), labels)
    assert same.verdict == "within noise" and (same.delta, same.low, same.high) == (0.0, 0.0, 0.0)
    worse = paired_difference(task, weak, strong, labels)
    assert worse.verdict == "worse" and worse.high < 0
    assert (worse.delta, worse.low, worse.high) == pytest.approx((-better.delta, -better.high, -better.low))


def test_two_equally_good_systems_are_within_noise() -> None:
    rng = np.random.default_rng(3)
    labels = labels_for("sst2", rng)
    a, b = system(labels, 0.8, rng), system(labels, 0.8, rng)
    found = paired_difference(TASKS["sst2"], a, b, labels)
    assert found.verdict == "within noise" and found.low < 0 < found.high


def test_the_average_interval_averages_the_evaluations_draws() -> None:
    rng = np.random.default_rng(4)
    found = []
    for name in ("sst2", "rte"):
        labels = labels_for(name, rng)
        found.append(
            paired_difference(TASKS[name], system(labels, 0.85, rng), system(labels, 0.7, rng), labels)
        )
    average = average_difference(found)
    assert average.delta == pytest.approx(np.mean([d.delta for d in found]))
    draws = (found[0].distribution + found[1].distribution) / 2
    assert (average.low, average.high) == pytest.approx(tuple(np.percentile(draws, [2.5, 97.5])))
    assert average.verdict == "better"


def test_the_detectable_effect_is_2_8_standard_errors_of_the_paired_difference() -> None:
    """On accuracy with one seed, Δ's standard error has a closed form: A right and B wrong on a
    fraction d₁ of n examples, the reverse on d₂, var(Δ) = (d₁ + d₂ − (d₁ − d₂)²) / n."""
    rng = np.random.default_rng(5)
    n = 2000
    labels = rng.integers(0, 2, n)
    outcome = rng.choice(4, n, p=[0.70, 0.12, 0.08, 0.10])  # both right, only A, only B, both wrong
    a = np.where((outcome == 0) | (outcome == 1), labels, 1 - labels)[None]
    b = np.where((outcome == 0) | (outcome == 2), labels, 1 - labels)[None]
    found = paired_difference(TASKS["sst2"], a, b, labels)
    d1, d2 = np.mean(outcome == 1), np.mean(outcome == 2)
    standard_error = 100 * np.sqrt((d1 + d2 - (d1 - d2) ** 2) / n)
    assert found.detectable == pytest.approx(2.8016 * standard_error, rel=0.05)
    # the planted Δ (4 points) is above it, and found
    assert found.delta == pytest.approx(100 * (d1 - d2)) and found.delta > found.detectable
    assert found.verdict == "better"


def test_a_within_noise_average_is_reported_with_what_the_comparison_could_find() -> None:
    from lmpipe.report.glue import in_short
    from lmpipe.report.significance import Difference

    draws = np.random.default_rng(6).normal(0.5, 1.0, significance.RESAMPLES)
    found = {"sst2": Difference(0.5, -1.4, 2.4, draws), "average": Difference(0.5, -1.4, 2.4, draws)}
    (line, _) = in_short({}, {"enc": found}, "enc", {})
    assert line.startswith("- **enc** pretrained: no difference from scratch on the GLUE average beyond")
    assert "(+0.5 [-1.4, +2.4]; these dev sets and seeds find ±2.8 or more 80 % of the time)" in line


def test_the_interval_is_the_same_on_any_number_of_blas_threads() -> None:
    """A flow gives a stage its share of the cores (OMP_NUM_THREADS); the bootstrap's matrix products
    run on one BLAS thread all the same, since another split of the sums gives other float bits."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(3)
    labels = rng.normal(size=1500)
    a = labels + rng.normal(scale=0.5, size=(3, 1500))
    b = labels + rng.normal(scale=0.7, size=(3, 1500))
    found = []
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            found.append(paired_difference(TASKS["stsb"], a, b, labels))
    assert (found[0].low, found[0].high) == (found[1].low, found[1].high)
    np.testing.assert_array_equal(found[0].distribution, found[1].distribution)
