"""Ablation sweeps: a grid of params, every point a DVC experiment, one comparison at the end.

A preset is a paper's table: its card (flows/presets/, a module per paper) holds the rows under the
paper's names with its figures, the ★ row, how compute is matched and how our setup differs; the
report and the sweep's MLflow parent run print it. Commit a reproduced baseline first and only what
the swept params reach re-runs. MLflow gets one
parent run for the sweep, one child per point tagged with its overridden values, and every stage run
of the point nested under that child. The comparison (markdown, csv, plots) goes to
reports/ablation/<sweep>/ and to the parent run. What sweeps share (points, pools, MLflow, the
command line): flows/sweep.py.

    python -m flows.ablation masking_rate
    python -m flows.ablation masking_rate --plan   # the card, the points and their cost; runs nothing
    python -m flows.ablation --grid '{"objectives.mlm.mask_rate": [0.1, 0.2], "pretrain.lr": [1e-3, 3e-4]}'
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

from flows import profile as profiles
from flows.common import PipelineError
from flows.plan import here
from flows.presets import CARDS, STUDENTS_KEY, Card, Row, card_lines, effect
from flows.sweep import (
    MODELS_KEY,
    Corpus,
    DvcRemote,
    GitRemote,
    Glue,
    MaxParallel,
    Option,
    Point,
    Pool,
    Profile,
    Repo,
    SetParams,
    Sweep,
    SweepName,
    command_line,
    png,
    point_overrides,
    point_params,
    points_at_once,
    set_overrides,
    text,
)
from lmpipe.layout import INITS
from lmpipe.params.project import Params
from lmpipe.params.schema import PARAMS_FILE, read_params_yaml
from lmpipe.report import context
from lmpipe.runtime import StageError

Grid = dict[str, list[Any]] | list[dict[str, Any]]


@dataclass(frozen=True)
class Planned:
    """The points a sweep runs: their values, each one's row of the preset's card (None for a grid),
    and the index of the point every other is compared with; the card and all its rows."""

    values: list[dict[str, Any]]
    rows: list[Row | None]
    base: int
    card: Card | None = None
    card_rows: list[Row] = field(default_factory=list)

    @property
    def equal_flops(self) -> bool:
        return self.card is not None and self.card.compute == "equal FLOPs"

    def reported(self) -> list[str | None]:
        """Each point's model the comparison reports (None: every model it trains)."""
        return [None if row is None else row.model for row in self.rows]

    def paper(self) -> list[tuple[str | None, float | None]]:
        """Each point's row of the paper, by its name, and what the paper measured for it against ★."""
        return [(None, None) if row is None else (row.name, effect(row, self.card_rows)) for row in self.rows]

    def at_equal_flops(
        self, overrides: list[list[str]], validated: Sequence[Params]
    ) -> tuple[list[list[str]], float | None, str | None]:
        """With an equal-FLOPs card, every point's overrides with its budget (the ★ point's FLOPs times
        its row's cost), the budget, and that in words; else the overrides as they are."""
        if not self.equal_flops:
            return overrides, None, None
        budget, words = equal_flops_budget(validated, self.base)
        with_budget = [
            [*point, f"pretrain.max_flops={budget * row.cost!r}"]
            for row, point in zip(self.rows, overrides, strict=True)
        ]
        return with_budget, budget, words


def planned(
    preset: str | None,
    grid: Grid | None,
    params: Mapping[str, Any],
    baseline: Mapping[str, Any] | None = None,
    numbers: Sequence[int] | None = None,
) -> Planned:
    """A preset's card rows (those numbered `numbers`, from 1, if given) on the params its points start
    from, or the grid's points; the baseline: the point matching `baseline`, else the card's ★ row, else
    the first point."""
    if (preset is None) == (grid is None):
        raise PipelineError(f"give either a preset ({', '.join(CARDS)}) or a grid, not both or neither")
    if preset is None:
        if numbers is not None:
            raise PipelineError("--rows picks a preset's rows; with --grid give only the points to run")
        values = expand(grid)
        base = baseline_index(values, baseline) if baseline else 0
        return Planned(values, [None] * len(values), base)
    if preset not in CARDS:
        raise PipelineError(f"preset '{preset}' is unknown (presets: {', '.join(CARDS)})")
    card = CARDS[preset]
    rows = every = card.rows_on(params)
    values = expand([row.point for row in rows])
    base = baseline_index(values, baseline) if baseline else next(i for i, row in enumerate(rows) if row.star)
    if numbers is not None:
        kept = [number for number in numbers if type(number) is int and 1 <= number <= len(rows)]
        if not numbers or len(set(kept)) != len(numbers):
            given = json.dumps(list(numbers))
            raise PipelineError(
                f"--rows {given}: give distinct row numbers from 1 to {len(rows)} (preset {preset})"
            )
        if base + 1 not in numbers:
            raise PipelineError(
                f"--rows {json.dumps(list(numbers))}: the baseline, row {base + 1}, must be among them"
            )
        order = sorted(numbers)
        base = order.index(base + 1)
        rows, values = [rows[n - 1] for n in order], [values[n - 1] for n in order]
    return Planned(values, list(rows), base, card, every)


def expand(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A dict of value lists is their product (in key order); a list of dicts is the points as given."""
    if isinstance(grid, Mapping):
        for key, values in grid.items():
            if isinstance(values, str) or not isinstance(values, Sequence) or not values:
                raise PipelineError(f"grid key '{key}': give a non-empty list of values")
        return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    points = [dict(point) for point in grid]
    if not points or not all(points):
        raise PipelineError("grid: give at least one point, each with at least one key")
    return points


def equal_flops_budget(points: Sequence[Params], base: int) -> tuple[float, str]:
    """The FLOPs every point gets: what the baseline point's one model spends on its step budget; and
    that in words. Every model of every point must afford its warmup on it."""
    from lmpipe.pretraining import budget

    baseline = points[base]
    if len(baseline.models) != 1:
        raise PipelineError(f"equal FLOPs: the baseline point trains {len(baseline.models)} models, not one")
    (model,) = baseline.models
    baseline_budget = budget(baseline, model, baseline.tokenizer.vocab_size)
    flops = baseline_budget.train_flops
    for params in points:
        pretrain = params.pretrain.model_copy(update={"max_flops": flops})
        equal = params.model_copy(update={"pretrain": pretrain})
        for name in params.models:
            try:  # every model affords its warmup on it
                budget(equal, name, params.tokenizer.vocab_size)
            except StageError as exc:
                raise PipelineError(f"equal FLOPs: {exc}") from None
    return float(flops), f"{flops:.3g} FLOPs each, what {model} spends on its {baseline_budget.steps} steps"


def label(point: Mapping[str, Any], swept: Sequence[str]) -> str:
    """The swept values the point sets (one it leaves out keeps the params' value)."""
    shown = [f"{key.split('.')[-1]}={text(point[key])}" for key in swept if key in point]
    return ", ".join(shown) or "baseline"


def baseline_index(values: Sequence[Mapping[str, Any]], wanted: Mapping[str, Any]) -> int:
    """The 0-based point that holds `wanted`'s values (exactly one must)."""
    matches = [i for i, point in enumerate(values) if has_values(point, wanted)]
    if len(matches) != 1:
        found = "no point" if not matches else f"{len(matches)} points"
        raise PipelineError(f"baseline {json.dumps(wanted)}: {found} of the grid match it (need exactly one)")
    return matches[0]


def has_values(point: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a point (or a comparison row) holds each of `wanted`'s values; `models` by the names of
    the models it trains."""

    def shown(key: str, value: Any) -> str:
        return text(value) if key == MODELS_KEY and value is not None else json.dumps(value)

    return all(shown(key, point.get(key)) == shown(key, value) for key, value in wanted.items())


def same_examples(idx: Mapping[str, Any], other: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """Whether two evaluations scored the same dev examples of every task in `labels` (a pairing)."""
    return all(key in other and np.array_equal(idx[key], other[key]) for key in labels)


def comparison(
    points: Sequence[Point],
    results: Mapping[int, dict[str, Any]],
    swept: Sequence[str],
    baseline: Point,
    seed: int,
    paper: Sequence[tuple[str | None, float | None]] = (),
    reported: Sequence[str | None] = (),
) -> pd.DataFrame:
    """One row per (point, model) (per point, where `reported` names the point's model): the swept
    values; GLUE average and tasks of the pretrained model (median over seeds) with their std over
    seeds; Δ against scratch with its interval and verdict (from the point's evaluate stage); Δ against
    the baseline point's model (its reported one, else the same model or its only one) with interval
    and verdict (a paired bootstrap over the same dev examples, as `evaluate` does); the final
    pretraining loss."""
    from lmpipe.report.glue import read_aligned
    from lmpipe.report.significance import compare

    base_runs, _, base_idx = (
        read_aligned(results[baseline.index]["predictions"]) if baseline.index in results else ({}, {}, {})
    )
    base_model = reported[baseline.index - 1] if reported else None
    rows = []
    for point in points:
        if point.index not in results:
            continue
        runs, labels, idx = read_aligned(results[point.index]["predictions"])
        own = reported[point.index - 1] if reported else None
        for model, scores in results[point.index]["glue"].items():
            if own is not None and model != own:  # a model the point trains for its own (a teacher)
                continue
            row: dict[str, Any] = {"experiment": point.experiment, "point": label(point.values, swept)}
            # the paper's row the point runs, and what the paper measured for it against its ★ row
            row["paper_row"], row["paper_effect"] = paper[point.index - 1] if paper else (None, None)
            # a key the point leaves out: None, the params' value
            row.update({key: point.values.get(key) for key in swept})
            for named in (MODELS_KEY, STUDENTS_KEY):  # name -> spec: the names say it
                if row.get(named) is not None:
                    row[named] = text(row[named])
            row["model"] = model
            tasks = [k for k in scores["pretrained"] if k != "average"]
            for key in ["average", *tasks]:
                column = "glue_average" if key == "average" else key
                row[column] = scores["pretrained"][key]
                row[f"{column}_std"] = scores["pretrained_std"][key]
            # the scratch baseline's own level: architectures differ in it, so Δ vs scratch alone hides it
            row["scratch_average"] = scores["scratch"]["average"]
            row["scratch_average_std"] = scores["scratch_std"]["average"]
            row["delta_average"] = scores["delta"]["average"]
            row["delta_average_low"] = scores["delta_low"]["average"]
            row["delta_average_high"] = scores["delta_high"]["average"]
            row["delta_average_verdict"] = scores["verdict"]["average"]
            row["delta_average_detectable"] = scores["delta_detectable"]["average"]
            against = base_model or (model if (model, "pretrained") in base_runs else _only_model(base_runs))
            comparable = against is not None and same_examples(idx, base_idx, labels)
            if not base_runs:
                status = "baseline point failed"
            elif point.index == baseline.index and against == model:
                status = "baseline"
            elif not comparable:
                status = "not comparable (other dev examples or models)"
            else:
                status = None
            mine, theirs = runs[(model, "pretrained")], base_runs.get((against, "pretrained"))
            versus = compare(mine, theirs, labels, seed) if status is None else {}
            for key in ["average", *tasks]:
                prefix = "vs_baseline" if key == "average" else f"{key}_vs_baseline"
                found = versus.get(key)
                row[prefix] = found.delta if found else float("nan")
                row[f"{prefix}_low"] = found.low if found else float("nan")
                row[f"{prefix}_high"] = found.high if found else float("nan")
                row[f"{prefix}_verdict"] = found.verdict if found else status
                row[f"{prefix}_detectable"] = found.detectable if found else float("nan")
            pretrain = results[point.index]["pretrain"][model]
            row["pretrain_steps"], row["train_flops"] = pretrain["steps"], pretrain["train_flops"]
            row["parameters"] = pretrain["parameters"]  # T5's table sets 2P (encoder-decoder) against P
            # a student's training loss is its triple loss; its validation loss is its objective's alone
            row["val_loss"] = pretrain.get("val_loss")
            row["teacher"] = pretrain.get("teacher")
            row["weights"] = scores["weights"]  # what fine-tuning trains of them (finetune.method)
            curve = results[point.index]["curves"][model]["train_loss"].dropna()
            row["final_train_loss"] = float(curve.iloc[-1]) if len(curve) else float("nan")
            rows.append(row)
    return pd.DataFrame(rows)


def best_of_each_init(
    points: Sequence[Point], results: Mapping[int, dict[str, Any]], seed: int
) -> pd.DataFrame:
    """For a sweep of fine-tuning values: each model's pretrained init at its best point against its
    scratch init at its best (by GLUE average), a paired bootstrap over the same dev examples and
    seeds. One shared recipe can favour one init: a pretrained init may want a higher learning rate
    than a random one. Both picks are made on the dev sets they are scored on, alike for both inits."""
    from lmpipe.report.glue import read_aligned
    from lmpipe.report.significance import compare

    done = [point for point in points if point.index in results]
    models = dict.fromkeys(model for point in done for model in results[point.index]["glue"])
    rows = []
    for model in models:
        having = [point for point in done if model in results[point.index]["glue"]]
        best = {
            init: max(having, key=lambda point: results[point.index]["glue"][model][init]["average"])
            for init in INITS
        }
        pretrained, labels, idx = read_aligned(results[best["pretrained"].index]["predictions"])
        scratch, _, scratch_idx = read_aligned(results[best["scratch"].index]["predictions"])
        row: dict[str, Any] = {"model": model}
        for init, point in best.items():
            row[f"{init}_experiment"] = point.experiment
            row[f"{init}_average"] = results[point.index]["glue"][model][init]["average"]
        if same_examples(idx, scratch_idx, labels):
            found = compare(pretrained[(model, "pretrained")], scratch[(model, "scratch")], labels, seed)
            average = found["average"]
            row.update(delta=average.delta, delta_low=average.low, delta_high=average.high)
            row.update(delta_verdict=average.verdict, delta_detectable=average.detectable)
        else:
            row.update(dict.fromkeys(("delta", "delta_low", "delta_high", "delta_detectable"), float("nan")))
            row["delta_verdict"] = "not comparable (other dev examples)"
        rows.append(row)
    return pd.DataFrame(rows)


def best_of_each_init_lines(best: pd.DataFrame) -> list[str]:
    lines = [
        "| model | pretrained: best point | scratch: best point | Δ pretrained − scratch |",
        "|---|---|---|---|",
    ]
    for row in best.to_dict("records"):
        picks = [f"`{row[f'{init}_experiment']}`: {row[f'{init}_average']:.2f}" for init in INITS]
        lines.append("| " + " | ".join([row["model"], *picks, _interval(row, "delta")]) + " |")
    return lines


def _only_model(runs: Mapping[tuple[str, str], Any]) -> str | None:
    models = {model for model, _ in runs}
    return next(iter(models)) if len(models) == 1 else None


def _interval(row: Mapping[str, Any], prefix: str) -> str:
    if pd.isna(row[prefix]):
        return str(row[f"{prefix}_verdict"])
    text = f"{row[prefix]:+.2f} [{row[f'{prefix}_low']:+.2f}, {row[f'{prefix}_high']:+.2f}]"
    verdict = row[f"{prefix}_verdict"]
    if verdict in ("better", "worse"):
        return f"{text} **{verdict}**"
    detectable = row[f"{prefix}_detectable"]
    return f"{text} {verdict}" + ("" if pd.isna(detectable) else f" (detects ±{detectable:.2f})")


def cell(value: Any) -> str:
    """A swept value in the table: blank where the point kept the params' value."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def task_columns(table: pd.DataFrame) -> list[str]:
    return [c[: -len("_vs_baseline_verdict")] for c in table.columns if c.endswith("_vs_baseline_verdict")]


def power_lines(table: pd.DataFrame, card: Card | None, seeds: int) -> list[str]:
    """For each within-noise point that the preset's paper measured: what this sweep detects against the
    paper's effect, and what would detect it. The bootstrap's detectable effect holds the dev examples'
    error with the fine-tuning seeds fixed; each point's seeds add their variance over `seeds` runs (the
    measured std over seeds of the GLUE average, a normal approximation). Seeds can resolve the effect
    when the dev examples alone detect it; otherwise only more dev examples (an interval narrows with
    the square root of the examples it resamples) or a larger effect."""
    from lmpipe.report.significance import Z_DETECTABLE

    base = table.loc[table["vs_baseline_verdict"] == "baseline", "glue_average_std"]
    base_std = float(base.iloc[0]) if len(base) else float("nan")
    lines = []
    for row in table.to_dict("records"):
        measured = row.get("paper_effect")
        if card is None or pd.isna(measured) or row["vs_baseline_verdict"] != "within noise":
            continue
        source = f"{card.source} ({row['paper_row']})"
        size, dev_only, std = abs(measured), row["vs_baseline_detectable"], row["glue_average_std"]
        # detectable² = dev_only² + seed_term / seeds: the seeds' term is their variance, both points'
        seed_term = Z_DETECTABLE**2 * (std**2 + base_std**2) if seeds > 1 else float("nan")
        said = f"- `{row['experiment']}`: {source} measured {measured:+.1f}; this comparison detects "
        if np.isfinite(seed_term):
            detectable = math.sqrt(dev_only**2 + seed_term / seeds)
            said += f"±{detectable:.2f} (±{dev_only:.2f} from the dev examples, and the seeds' std: "
            said += f"{std:.2f} here, {base_std:.2f} at the baseline, over {seeds} seeds)"
        else:
            seed_term, detectable = 0.0, dev_only
            said += f"±{dev_only:.2f} (the dev examples'; no seed spread measured)"
        if detectable <= size:
            lines.append(f"{said}, so an effect of the paper's size would have shown 80 % of the time.")
        elif dev_only < size:
            needed = math.ceil(seed_term / (size**2 - dev_only**2))
            lines.append(f"{said}: about {needed} seeds per point would detect {size:.1f}.")
        else:
            lines.append(
                f"{said}: the dev examples alone miss {size:.1f} at any number of seeds; about "
                f"{(dev_only / size) ** 2:.1f}× the dev examples would detect it, or a budget at which "
                "the effect is larger."
            )
    return lines


def markdown(
    table: pd.DataFrame,
    sweep: str,
    swept: Sequence[str],
    synthetic: bool,
    baseline: Point,
    compute: str | None = None,
    card: Card | None = None,
    card_rows: Sequence[Row] = (),
    seeds: int = 1,
    best: pd.DataFrame | None = None,
    here: Mapping[str, str] | None = None,
) -> str:
    from lmpipe.report.glue import weights_trained
    from lmpipe.report.significance import METHOD

    tasks = task_columns(table)
    header = (
        f"# Ablation `{sweep}`\n\n"
        "GLUE validation ×100 of the pretrained models: the median over fine-tuning seeds ± the std over "
        f"seeds. Δ vs scratch: pretrained − scratch of the same point. Δ vs baseline: against point "
        f"`{label(baseline.values, swept)}` ({baseline.experiment}): the model its row names, else the same "
        "model (or its only model). "
        f"Intervals are 95 %, from a {METHOD}; `better`/`worse` when the interval excludes 0; "
        "within noise, the effect that comparison detects 80 % of the time (2.8 standard errors).\n"
    )
    if compute:
        header += f"\nEqual compute: every point pretrains on a budget of {compute}.\n"
    if synthetic:
        header += "\n> **Synthetic data** (offline default profile): shows the pipeline, not the papers.\n"
    if card is not None:
        header += (
            "\n## The paper's table\n\n" + "\n".join(card_lines(card, card_rows, here)) + "\n\n## Ours\n"
        )
    paper = ["the paper's row", "the paper's Δ vs ★"] if card is not None else []
    columns = ["experiment", *paper, *swept, "model", "GLUE average", *tasks, "scratch average"]
    columns += ["Δ vs scratch", "Δ vs baseline", "parameters", "pretrain steps", "pretrain FLOPs"]
    methods = "finetune.method" in swept  # then what each point's method trains is what it varies
    columns += ["fine-tuning trains"] if methods else []
    columns += ["final train loss"]
    # a student's train loss is DistilBERT's triple loss: the objective's validation loss compares
    distilled = "teacher" in table and table["teacher"].notna().any()
    columns += ["teacher", "val loss"] if distilled else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table.to_dict("records"):
        cells = [row["experiment"]]
        if card is not None:
            measured = row.get("paper_effect")
            cells += [cell(row.get("paper_row")), "" if pd.isna(measured) else f"{measured:+.2f}"]
        cells += [*(cell(row.get(k)) for k in swept), row["model"]]
        cells += [f"{row['glue_average']:.2f} ± {row['glue_average_std']:.2f}"]
        cells += [f"{row[t]:.2f} ± {row[f'{t}_std']:.2f}" for t in tasks]
        cells += [f"{row['scratch_average']:.2f} ± {row['scratch_average_std']:.2f}"]
        cells += [_interval(row, "delta_average")]
        cells += [_interval(row, "vs_baseline"), f"{row['parameters'] / 1e6:.2f} M"]
        cells += [f"{row['pretrain_steps']}", f"{row['train_flops']:.3g}"]
        cells += [weights_trained(row["weights"])] if methods else []
        cells += [f"{row['final_train_loss']:.3f}"]
        loss = row["val_loss"]
        cells += [cell(row["teacher"]), "" if pd.isna(loss) else f"{loss:.3f}"] if distilled else []
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per task, Δ vs baseline:", ""]
    lines += ["| experiment | model | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    for row in table.to_dict("records"):
        cells = [_interval(row, f"{t}_vs_baseline") for t in tasks]
        lines.append(f"| {row['experiment']} | {row['model']} | " + " | ".join(cells) + " |")
    power = power_lines(table, card, seeds)
    if power:
        lines += ["", "Within noise, against the paper (80 % power, 95 % intervals):", "", *power]
    if best is not None and len(best):
        said = "Each init at its best point (a fine-tuning sweep: one shared recipe can favour one init):"
        lines += ["", said, "", *best_of_each_init_lines(best)]
    return header + "\n" + "\n".join(lines) + "\n"


def plot_scores(table: pd.DataFrame, swept: Sequence[str]) -> bytes:
    """GLUE average and each task against the swept value, one line per model, error bars the std over
    seeds; filled markers differ from the baseline (better or worse), hollow ones are within noise; a
    dotted line marks the baseline point's level. Then each point's pretrained − scratch Δ of the
    average with its 95 % interval, filled where the verdict is better or worse."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["glue_average", *task_columns(table)]
    numeric = len(swept) == 1 and swept[0] != MODELS_KEY and pd.api.types.is_numeric_dtype(table[swept[0]])
    x_of = (lambda frame: frame[swept[0]]) if numeric else (lambda frame: frame["point"])
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(4 * (len(metrics) + 1), 3.4), squeeze=False)
    _plot_delta_over_scratch(axes[0][-1], table, x_of)
    for ax, metric in zip(axes[0][:-1], metrics, strict=True):
        verdict = "vs_baseline_verdict" if metric == "glue_average" else f"{metric}_vs_baseline_verdict"
        for model, frame in table.groupby("model", sort=False):
            line = ax.errorbar(
                x_of(frame), frame[metric], yerr=frame[f"{metric}_std"], capsize=3, label=model
            )
            differs = frame[verdict].isin(["better", "worse"])
            ax.plot(x_of(frame)[differs], frame[metric][differs], "o", color=line[0].get_color())
            ax.plot(
                x_of(frame)[~differs], frame[metric][~differs], "o", mfc="white", color=line[0].get_color()
            )
            for value in frame[metric][frame["vs_baseline_verdict"] == "baseline"]:
                ax.axhline(value, linestyle=":", color=line[0].get_color())  # the baseline's level
        ax.set_title("GLUE average" if metric == "glue_average" else metric)
    for ax in axes[0]:
        ax.set_xlabel(swept[0] if numeric else "point")
        ax.tick_params(axis="x", labelrotation=0 if numeric else 30)
    axes[0][0].set_ylabel("score ×100 (± std over seeds)")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    return png(fig, plt)


def _plot_delta_over_scratch(ax, table: pd.DataFrame, x_of) -> None:
    """Pretrained − scratch Δ of the GLUE average per point, error bars its 95 % interval."""
    for model, frame in table.groupby("model", sort=False):
        delta = frame["delta_average"]
        interval = [delta - frame["delta_average_low"], frame["delta_average_high"] - delta]
        line = ax.errorbar(x_of(frame), delta, yerr=interval, capsize=3, label=model)
        verdict = frame["delta_average_verdict"].isin(["better", "worse"])
        ax.plot(x_of(frame)[verdict], delta[verdict], "o", color=line[0].get_color())
        ax.plot(x_of(frame)[~verdict], delta[~verdict], "o", mfc="white", color=line[0].get_color())
    ax.axhline(0.0, linestyle=":", color="grey")  # pretraining neither helps nor hurts
    ax.set_title("Δ pretrained − scratch (average)")
    ax.set_ylabel("Δ ×100 (95 % interval)")


def plot_losses(
    points: Sequence[Point], results: Mapping[int, dict[str, Any]], swept: Sequence[str]
) -> bytes:
    """The pretraining loss curves of every point and model, overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for point in points:
        for model, curve in results.get(point.index, {}).get("curves", {}).items():
            train = curve.dropna(subset=["train_loss"])
            ax.plot(train["step"], train["train_loss"], label=f"{model}: {label(point.values, swept)}")
    ax.set_xlabel("step")
    ax.set_ylabel("pretraining train loss")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return png(fig, plt)


def plot_context(table: pd.DataFrame) -> bytes:
    """The validation perplexity by evaluation context length of every point's model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    context.plot(table, ax)
    fig.tight_layout()
    return png(fig, plt)


def context_comparison(
    points: Sequence[Point], results: Mapping[int, dict[str, Any]], baseline: Point, seed: int
) -> pd.DataFrame:
    """The points' validation losses by context length (pretrain.context_lengths) against the baseline
    point's model (lmpipe/report/context.py); empty where no point measured them."""
    contexts = {
        (point.experiment, model): frame
        for point in points
        for model, frame in results.get(point.index, {}).get("contexts", {}).items()
        if len(frame)
    }
    measured = [key for key in contexts if key[0] == baseline.experiment]
    if not contexts or not measured:
        return pd.DataFrame()
    return context.comparison(contexts, measured[0], seed)


@flow(name="ablation", log_prints=True)
def ablation(
    preset: Annotated[str | None, Option(f"a named sweep: {', '.join(CARDS)}", positional=True)] = None,
    grid: Annotated[
        Grid | None, Option('JSON: {"key": [values], ...} (their product) or [{"key": value}, ...]')
    ] = None,
    baseline: Annotated[
        dict[str, Any] | None,
        Option(
            'JSON: the values of the point the others are compared with, e.g. {"pretrain.lr": 0.001} '
            "(default: the preset's, else the first point)"
        ),
    ] = None,
    rows: Annotated[
        list[int] | None,
        Option(
            "JSON: the preset's rows to run, numbered from 1 in its table's order (docs/experiments.md), "
            "e.g. [1, 3]; its baseline among them (default: every row)"
        ),
    ] = None,
    repo: Repo = ".",
    max_parallel: MaxParallel = None,
    name: SweepName = None,
    profile: Profile = None,
    corpus: Corpus = None,
    glue: Glue = None,
    set_params: SetParams = None,
    pool: Pool = None,
    dvc_remote: DvcRemote = None,
    git_remote: GitRemote = "origin",
) -> dict[str, Any]:
    """Run every point of `grid` (or of a named preset) as a DVC experiment; compare them, each against
    the `baseline` point (the values that identify it; by default the preset's, else the first point).
    With a `profile` (flows/profiles/<name>.yaml, its folders `corpus` and `glue`) every point runs on
    the profile's params, the point's values on top; `set_params` go between the two (a preset's table
    at another budget: its rows are made from the params they start from).

    With a `pool`, every point is a flow run of the deployment `ablation-point-<pool>` on any worker
    of that work pool (flows/dispatch.py): the committed and pushed HEAD, results through the
    `git_remote` and the DVC remote (`dvc_remote`, else the project's default), a crashed point run
    again up to the graph's largest `meta.retries` times. `max_parallel` caps the points in flight.

    Returns the comparison rows and where the report is; a failed point fails the flow after the
    comparison of the others is written.
    """
    logger = get_run_logger()
    at_once = points_at_once(max_parallel, pool)
    sweep = Sweep("ablation", repo, name, at_once, profile, corpus, glue, preset or "sweep", set_params)
    plan = planned(preset, grid, sweep.params, baseline, rows)
    values, base = plan.values, plan.base
    overrides = [sweep.overrides(point) for point in values]
    validated = [sweep.validate(point) for point in overrides]  # every point, up front
    keys = list(dict.fromkeys(key for point in values for key in point))
    swept = [key for key in keys if len({json.dumps(p.get(key), sort_keys=True) for p in values}) > 1]
    overrides, _, compute = plan.at_equal_flops(overrides, validated)

    points_planned = [
        (point, point_overrides_, {f"param.{key}": value for key, value in point_params(point).items()})
        for point, point_overrides_ in zip(values, overrides, strict=True)
    ]
    tags = {"preset": preset or ""}
    if plan.card is not None:
        tags |= {"paper": plan.card.paper, "paper_table": plan.card.table}
    grid_params = {"grid": json.dumps(values), "swept": ",".join(swept)}
    if set_params:
        grid_params["set_params"] = json.dumps(set_params)
    if rows is not None:
        grid_params["rows"] = json.dumps(rows)
    points = sweep.start(points_planned, tags, {}, grid_params, pool, git_remote, dvc_remote)
    logger.info("sweep %s: %d points over %s, %d at once", sweep.name, len(points), swept or keys, at_once)

    results, failed = sweep.run(points)
    for point in points:
        if point.index in failed:
            sweep.fail_point(point)
            continue
        scores = results[point.index]["glue"]
        metrics = {
            f"glue.{model}.{init}.{key}": value
            for model, inits in scores.items()
            for init, by_key in inits.items()
            for key, value in by_key.items()
            if isinstance(value, int | float)
        }
        metrics["duration_s"] = results[point.index]["seconds"]
        sweep.finish_point(point, metrics, point_params(point.values))

    seed = int(sweep.params.get("seed", 0))
    table = comparison(points, results, swept, points[base], seed, plan.paper(), plan.reported())
    if len(table):
        synthetic = validated[0].glue.synthetic
        seeds = len(validated[base].finetune.seeds)
        # where only fine-tuning values vary, each init's best point is a comparison of its own
        finetuning = bool(swept) and all(key.startswith("finetune.") for key in swept)
        best = best_of_each_init(points, results, seed) if finetuning else None
        model = plan.reported()[base] or next(iter(validated[base].models))
        ours = here(validated[base], model, plan.equal_flops)
        report = markdown(
            table,
            sweep.name,
            swept,
            synthetic,
            points[base],
            compute,
            plan.card,
            plan.card_rows,
            seeds,
            best,
            ours,
        )
        by_context = context_comparison(points, results, points[base], seed)
        if len(by_context):
            report += context.markdown(by_context, f"point `{label(points[base].values, swept)}`")
        report += sweep.where_points_ran(points, results, failed)
        files = {
            "comparison.csv": table.to_csv(index=False),
            "comparison.md": report,
            "glue.png": plot_scores(table, swept),
            "pretrain_loss.png": plot_losses(points, results, swept),
        }
        if len(by_context):
            files |= {"context.csv": by_context.to_csv(index=False), "context.png": plot_context(by_context)}
        if best is not None:
            files["best_of_each_init.csv"] = best.to_csv(index=False)
        if plan.card is not None:
            files["card.md"] = "\n".join(card_lines(plan.card, plan.card_rows, ours)) + "\n"
        sweep.publish(files, "comparison.md", "ablation-comparison")
        logger.info("comparison of %d points: %s\n%s", table["experiment"].nunique(), sweep.out, report)
    sweep.close({}, failed)
    return {
        "sweep": sweep.name,
        "report": str(sweep.out),
        "parent_run_id": sweep.parent,
        "rows": table.to_dict("records"),
    }


def check(arguments: dict[str, Any]) -> None:
    """The command line's input, one line each, before any flow starts."""
    repo_dir = Path(arguments["repo"]).resolve()
    params_file = repo_dir / PARAMS_FILE
    params, origin = read_params_yaml(params_file) or {}, None
    set_params = arguments["set_params"]
    if set_params is not None and not isinstance(set_params, dict):
        raise PipelineError('--set-params: give an object of values, e.g. {"pretrain.max_steps": 1000}')
    if arguments["profile"] or set_params:  # a point starts from these params: its keys are the ones to check
        origin = f"profile {arguments['profile']}" if arguments["profile"] else str(params_file)
        on_profile = set_overrides(set_params)
        if arguments["profile"]:
            on_profile[:0] = profiles.overrides(arguments["profile"], arguments["corpus"], arguments["glue"])
        params = profiles.applied(repo_dir, on_profile, origin)
        if set_params:  # a bad key or value is one line here, before any flow starts
            profiles.parsed(params, f"{origin} with --set-params")
    baseline = arguments["baseline"]
    if baseline is not None and not isinstance(baseline, dict):
        raise PipelineError('--baseline: give an object of values, e.g. {"pretrain.lr": 0.001}')
    plan = planned(arguments["preset"], arguments["grid"], params, baseline, arguments["rows"])
    for point in plan.values:
        point_overrides(point, params, params_file, origin)


def plan(arguments: dict[str, Any]) -> str:
    """`--plan`: the card, every point against the baseline, its FLOPs and estimated time; runs nothing."""
    from flows.plan import plan_text

    sweep = Sweep(
        "ablation",
        arguments["repo"],
        arguments["name"],
        1,
        arguments["profile"],
        arguments["corpus"],
        arguments["glue"],
        arguments["preset"] or "sweep",
        arguments["set_params"],
    )
    found = planned(
        arguments["preset"], arguments["grid"], sweep.params, arguments["baseline"], arguments["rows"]
    )
    overrides = [sweep.overrides(point) for point in found.values]
    if found.equal_flops:  # the points' steps at the budget: validated again with it
        overrides, budget, _ = found.at_equal_flops(overrides, [sweep.validate(point) for point in overrides])
    else:
        budget = None
    validated = [sweep.validate(point) for point in overrides]
    return plan_text(found.card, found.card_rows, found.rows, validated, found.base, budget, sweep.repo_dir)


def main(argv: Sequence[str] | None = None) -> int:
    summary = lambda result: f"comparison: {result['report']}/comparison.md"  # noqa: E731
    return command_line(ablation, argv, check, summary, plan)


if __name__ == "__main__":
    sys.exit(main())
