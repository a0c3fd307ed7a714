"""Plot pretrained − scratch Δ against the pretraining budget, one panel per architecture.

Reads ``transfer-by-budget.csv`` beside this script: one row per plotted point, each number
(Δ and its 95 % paired-bootstrap interval, 3 seeds) as the research log ``2026-11.md`` states it
in the entry the ``entry`` column names. SST-2 unless ``tasks`` is ``small`` (the average over
CoLA, STS-B, MRPC and RTE). The x axis is the budget in the ``real-cpu`` profile's CPU-minutes on
the 2-core Zen 4; points of one x are drawn side by side.

    python docs/results/plot_transfer.py [--out PATH]

writes ``transfer-by-architecture.png`` beside this script unless ``--out`` says otherwise, and prints,
for each series with three or more budgets, the straight line through Δ against log2(budget) (weighted
by each point's interval) and the budget at which that line would reach the +3 goal.
"""

import argparse
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

HERE = Path(__file__).parent
PANELS = {
    "decoder": "decoder (CLM)",
    "encoder": "encoder (MLM)",
    "encoder-decoder": "encoder-decoder (span)",
}
COLOURS = {
    "corpus (2.9 M tokens)": "tab:gray",
    "corpus-large (90.9 M)": "tab:blue",
    "corpus-large, GLUE text 44 %": "tab:purple",
    "corpus-large, fine-tuned at 3e-4": "tab:purple",
    "... small tasks' average (1e-4, both inits' SST-2 best)": "tab:green",
    "... small tasks' average at 3e-4": "tab:green",
    "... small tasks' average at 1e-4 (both inits)": "tab:green",
    "... small tasks' average, each init at its best rate": "tab:orange",
}
SPREAD = 0.06  # neighbouring series of a panel sit 6 % of x apart
GOAL = 3.0


def plot(data: pd.DataFrame, out: Path) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8), sharey=True, dpi=110)
    for ax, (arch, title) in zip(axes, PANELS.items(), strict=True):
        rows = data[data.architecture == arch]
        series = list(dict.fromkeys(rows.series))  # the CSV's order
        for i, name in enumerate(series):
            s = rows[rows.series == name]
            x = s.cpu_minutes * (1 + SPREAD * (i - (len(series) - 1) / 2))
            yerr = [s.delta - s.low, s.high - s.delta]
            ax.errorbar(x, s.delta, yerr=yerr, fmt="o", capsize=3, color=COLOURS[name], label=name)
        ax.axhline(GOAL, color="tab:green", linestyle="--", linewidth=0.8)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlim(22, 160)
        ax.set_xticks([30, 45, 60, 120], labels=["30", "45", "60", "120"])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_ylim(-15, 6)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("pretraining budget (CPU-minutes, 2-core Zen 4)", fontsize=8)
        ax.legend(loc="lower right", fontsize=7)
    axes[0].set_ylabel("Δ vs scratch (points, 95 % CI)")
    fig.suptitle(
        "SST-2 (unless marked): pretrained − scratch, 3 seeds, paired bootstrap; dashed: the +3 goal",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out)


def budget_reaching_goal(x0: float, y0: float, slope: float) -> str:
    """Where the line of this slope (Δ per doubling) through (log2 minutes x0, Δ y0) meets GOAL."""
    if slope <= 0:
        return "never"
    minutes = 2 ** (x0 + (GOAL - y0) / slope)
    return f"{minutes:,.0f} min" if minutes < 1e6 else "beyond 10^6 min"


def goal_lines(data: pd.DataFrame) -> list[str]:
    """Per series of 3+ budgets: Δ = a + b·log2(minutes), each point weighted by 1/SE² (SE: its 95 %
    interval's half-width / 1.96), and where the line meets GOAL; b's own 95 % interval, the line
    turned about the points' weighted centre, says how far the few points pin the trend."""
    lines = []
    for (arch, name), s in data.groupby(["architecture", "series"], sort=False):
        if s.cpu_minutes.nunique() < 3:
            continue
        x, se = np.log2(s.cpu_minutes), (s.high - s.low) / (2 * 1.96)
        (slope, intercept), cov = np.polyfit(x, s.delta, 1, w=1 / se, cov="unscaled")
        half = 1.96 * np.sqrt(cov[0, 0])
        x0 = np.average(x, weights=1 / se**2)  # the weighted fit passes through this centre
        y0 = intercept + slope * x0
        reach = [budget_reaching_goal(x0, y0, b) for b in (slope, slope + half, slope - half)]
        budgets = "/".join(f"{m:g}" for m in s.cpu_minutes)
        lines.append(
            f"{arch}, {name} ({budgets} min): {slope:+.2f} per doubling [{slope - half:+.2f}, "
            f"{slope + half:+.2f}]; +{GOAL:g} at {reach[0]} (slope's interval: {reach[1]} to {reach[2]})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "transfer-by-architecture.png")
    args = parser.parse_args()
    data = pd.read_csv(HERE / "transfer-by-budget.csv")
    plot(data, args.out)
    print("\n".join(goal_lines(data)))


if __name__ == "__main__":
    main()
