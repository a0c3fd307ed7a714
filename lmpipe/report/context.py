"""The validation loss by evaluation context length (pretrain.context_lengths), compared between the
points of a sweep: each model's perplexity at each attention length over the same validation tokens,
and its mean next-token loss against the baseline point's at that length, with a 95 % interval from a
paired bootstrap over the blocks of tokens (both models scored the same blocks). Lower is better. A
point pretrains once: the interval holds what the choice of validation text can change, not what
another pretraining seed would."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from lmpipe.report.significance import CONFIDENCE, RESAMPLES, Z_DETECTABLE

METHOD = (
    "paired bootstrap over blocks of validation tokens (models/context.py's BLOCK; scipy.stats.bootstrap, "
    "percentile, 9,999 resamples)"
)


@dataclass(frozen=True)
class LossDifference:
    """A's mean loss − B's at one context length (nats a token), its interval and verdict."""

    delta: float
    low: float
    high: float
    detectable: float  # the smallest |Δ| found 80 % of the time: 2.8 bootstrap standard errors

    @property
    def verdict(self) -> str:
        if self.high < 0:
            return "better"
        return "worse" if self.low > 0 else "within noise"


def by_length(frame: pd.DataFrame) -> dict[int, np.ndarray]:
    """A model's context CSV (lmpipe/pretraining.py: write_context) as length -> its blocks' losses, in
    (stream, block) order."""
    ordered = frame.sort_values(["length", "stream", "block"])
    return {int(n): group["loss"].to_numpy() for n, group in ordered.groupby("length")}


def loss_difference(mine: np.ndarray, theirs: np.ndarray, seed: int) -> LossDifference:
    """Mean loss of `mine` − `theirs` over the same blocks, with a paired bootstrap over the blocks."""
    if mine.shape != theirs.shape:
        raise ValueError(f"{mine.shape} blocks against {theirs.shape}: not the same tokens")
    differences = mine - theirs
    result = bootstrap(
        (differences,),
        np.mean,
        confidence_level=CONFIDENCE,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    spread = float(Z_DETECTABLE * result.standard_error)
    return LossDifference(float(differences.mean()), float(low), float(high), spread)


def comparison(
    contexts: Mapping[tuple[str, str], pd.DataFrame], baseline: tuple[str, str], seed: int
) -> pd.DataFrame:
    """One row per (experiment, model, length): perplexity, and Δ mean loss against `baseline` (an
    (experiment, model)) at the lengths both measured."""
    base = by_length(contexts[baseline]) if baseline in contexts else {}
    rows = []
    for (experiment, model), frame in contexts.items():
        for length, losses in by_length(frame).items():
            row = {"experiment": experiment, "model": model, "length": length, "tokens": losses.size}
            row["perplexity"] = float(np.exp(losses.mean()))
            if (experiment, model) == baseline:
                row["verdict"] = "baseline"
            elif length in base:
                difference = loss_difference(losses, base[length], seed)
                row |= {"delta": difference.delta, "low": difference.low, "high": difference.high}
                row |= {"detectable": difference.detectable, "verdict": difference.verdict}
            else:
                row["verdict"] = "baseline not measured at this length"
            rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, baseline: str) -> str:
    """The comparison as a table: a row a model, a column a context length."""
    lengths = sorted(table["length"].unique())
    header = (
        "\n## Validation loss by evaluation context length\n\n"
        "Perplexity over the same validation tokens at each attention length (`pretrain.context_lengths`, "
        f"models/context.py); Δ: the mean next-token loss (nats) against {baseline} at that length, with "
        f"its 95 % interval from a {METHOD}; lower is better. Each point pretrained once: the interval "
        "holds the choice of validation text, not a pretraining seed's spread.\n\n"
    )
    lines = ["| experiment | model | " + " | ".join(f"L = {n}" for n in lengths) + " |"]
    lines.append("|---|---|" + "---|" * len(lengths))
    for (experiment, model), rows in table.groupby(["experiment", "model"], sort=False):
        cells = []
        for length in lengths:
            found = rows[rows["length"] == length]
            if found.empty:
                cells.append("—")
                continue
            row = found.iloc[0]
            cell = f"{row['perplexity']:.2f}"
            if not pd.isna(row.get("delta", np.nan)):
                cell += f", Δ {row['delta']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] {row['verdict']}"
            cells.append(cell)
        lines.append(f"| {experiment} | {model} | " + " | ".join(cells) + " |")
    return header + "\n".join(lines) + "\n"


def plot(table: pd.DataFrame, ax) -> None:
    """Perplexity by context length on `ax`, a line a model."""
    for (experiment, model), rows in table.groupby(["experiment", "model"], sort=False):
        rows = rows.sort_values("length")
        ax.plot(rows["length"], rows["perplexity"], "o-", label=f"{model}: {experiment}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation context length (tokens attended at a segment's end)")
    ax.set_ylabel("validation perplexity")
    ax.legend(fontsize="small")
