"""The papers' tables as presets: a card per table, one module per paper.

A card holds what a researcher checks a preset against with the paper open: the paper and its table,
each row under the paper's own name with the paper's figure, the ★ row every other is compared with,
how compute is matched (equal FLOPs, or the same steps as the paper trained its rows), and every way
our setup differs from the paper's run. A row's `point` is what the sweep runs (flows/ablation.py):
DVC overrides by dotted key, and `models` naming or defining the model variants it trains
(flows/sweep.py: point_overrides). Rows that depend on the size they run at (T5's architectures,
BERT's depth against width) are a function of the params the sweep starts from.

    python -m flows.presets --write     # docs/experiments.md's preset table and the README's status
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MODELS_KEY = "models"  # flows/sweep.py's: which model variants of params.yaml a point trains
STUDENTS_KEY = "distill.students"  # the students a point distils (each a model of its own)
Compute = Literal["equal FLOPs", "equal steps", "fine-tuning only"]


@dataclass(frozen=True)
class Row:
    """One row of a paper's table: its name in the paper, the point that runs it, the paper's figure in
    the card's metric (None: the paper gives none for it), its share of the equal-FLOPs budget (T5's
    half-depth encoder-decoder: M/2), and the model it reports."""

    name: str
    point: Mapping[str, Any]
    figure: float | None = None
    star: bool = False
    cost: float = 1.0
    # the model of the point the row reports, where the point trains others too (a student's teacher);
    # None: every model the point trains. The ★ row's is what every row is compared with
    model: str | None = None


@dataclass(frozen=True)
class Setup:
    """How the paper trained and evaluated its rows: each beside what a sweep's points do here (the
    plan and the report read ours from the points' params)."""

    model: str
    data: str
    steps: str  # steps, batch and sequence length
    tokenizer: str
    evaluation: str


@dataclass(frozen=True)
class Card:
    """One table of one paper, as a preset."""

    preset: str
    paper: str  # "BERT (Devlin et al., 2019)"
    table: str  # "Table 5", "Figure 3"
    compares: str  # what the table compares, in a line
    metric: str  # what the figures are: "GLUE dev average", "MNLI-m dev accuracy", ...
    figures_from: str  # where the figures were read: the paper, or the seeds' notes (and what they lack)
    compute: Compute
    rows: Sequence[Row] | Callable[[Mapping[str, Any]], Sequence[Row]]
    setup: Setup  # the paper's run, set beside ours in the plan and the report
    differences: tuple[str, ...] = field(default=())  # what else differs from the paper's rows
    digits: int = 1  # the figures' decimals, as the paper prints them

    def figure(self, row: Row) -> str:
        return "—" if row.figure is None else f"{row.figure:.{self.digits}f}"

    def rows_on(self, params: Mapping[str, Any]) -> list[Row]:
        """The rows on the params a point starts from (the profile's sizes)."""
        rows = list(self.rows(params) if callable(self.rows) else self.rows)
        stars = [row.name for row in rows if row.star]
        if len(stars) != 1:
            raise ValueError(f"preset {self.preset}: {len(stars)} ★ rows ({stars}); a card has one")
        return rows

    @property
    def source(self) -> str:
        return f"{self.paper}, {self.table}"


def star(rows: Sequence[Row]) -> Row:
    return next(row for row in rows if row.star)


def effect(row: Row, rows: Sequence[Row]) -> float | None:
    """What the paper measured for `row` against the ★ row, in the card's metric; None where either
    figure is missing."""
    base = star(rows).figure
    return None if row.figure is None or base is None or row.star else row.figure - base


def made_from(base: str, name: str, **fields: Any) -> dict[str, Any]:
    """A point that trains its own model `name`: `base`'s fields (its size on the profile) with `fields`
    changed."""
    return {MODELS_KEY: {name: {"from": base, **fields}}}


def model_fields(params: Mapping[str, Any], model: str, preset: str) -> dict[str, Any]:
    """The size fields (`d_model`, `n_layers`, …) of `model` in the params a point starts from."""
    from flows.common import PipelineError
    from lmpipe.params.models import ModelParams

    models = params.get(MODELS_KEY) or {}
    if model not in models:
        raise PipelineError(f"preset {preset}: its rows are made from models.{model}, not found")
    return ModelParams.model_validate(models[model]).config_fields()


def seq_len_of(params: Mapping[str, Any], model: str) -> int:
    """The sequence length `model` pretrains at in the params a point starts from (its own value first)."""
    from lmpipe.params.pretrain import PretrainParams

    own = (params[MODELS_KEY][model] or {}).get("pretrain") or {}
    return PretrainParams.model_validate({**(params.get("pretrain") or {}), **own}).seq_len


def max_len_for(params: Mapping[str, Any], model: str, arch: str, objective: str, **args: Any) -> int:
    """The max_len `model` (of the params, which its preset has checked) needs as `arch` to read a row of
    `objective` (its params section with `args` changed) at its sequence length: at least its own."""
    from lmpipe.params.models import ModelParams
    from lmpipe.params.pretrain import longest_read, objectives_params, section_params

    fields = ModelParams.model_validate(params[MODELS_KEY][model]).config_fields()
    seq_len = seq_len_of(params, model)
    sections = dict(params.get("objectives") or {})
    sections[objective] = {**sections.get(objective, {}), **args}
    section = section_params(objectives_params(sections), objective)
    return max(fields["max_len"], longest_read(arch, objective, seq_len, section))


def on_segment_pairs(
    params: Mapping[str, Any], base: str, input_format: str = "segment_pair", **fields: Any
) -> dict[str, Any]:
    """A model spec made from `base` with BERT's segment embeddings, reading `input_format` (its own
    `pretrain` values kept): a point training it also sets `pack.sentences`."""
    own = (params[MODELS_KEY][base] or {}).get("pretrain") or {}
    return {
        "from": base,
        "segment_embeddings": True,
        **fields,
        "pretrain": {**own, "input_format": input_format},
    }


def _cards() -> dict[str, Card]:
    from flows.presets import (
        albert,
        bart,
        bert,
        distilbert,
        electra,
        gpt,
        lineage,
        mae_lm,
        mtp,
        peft,
        roberta,
        spanbert,
        systems,
        t5,
        transformer_xl,
        unilm,
        xlnet,
    )

    cards: dict[str, Card] = {}
    for module in (
        bert,
        systems,
        t5,
        bart,
        roberta,
        albert,
        spanbert,
        mae_lm,
        electra,
        gpt,
        lineage,
        transformer_xl,
        xlnet,
        mtp,
        unilm,
        peft,
        distilbert,
    ):
        for card in module.CARDS:
            if card.preset in cards:
                raise ValueError(f"preset {card.preset}: two cards")
            cards[card.preset] = card
    return cards


CARDS: dict[str, Card] = _cards()


COMPUTE = {
    "equal FLOPs": "equal training FLOPs: every row gets what the ★ row spends on its steps (times its "
    "cost), counted with each model's heads",
    "equal steps": "the same steps for every row, as the paper trained them",
    "fine-tuning only": "one pretrained model; the rows differ in fine-tuning alone",
}


def card_lines(card: Card, rows: Sequence[Row], here: Mapping[str, str] | None = None) -> list[str]:
    """The card as markdown: the paper's table (its rows, figures and ★), how compute is matched, the
    paper's setup beside ours (`here`, by Setup field), and what else differs."""
    lines = [f"**{card.source}**: {card.compares}.", ""]
    lines += ["| # | the paper's row | the paper's figure | Δ vs ★ |", "|---:|---|---:|---:|"]
    for number, row in enumerate(rows, start=1):
        name = f"**{row.name}** ★" if row.star else row.name
        figure = card.figure(row)
        delta = effect(row, rows)
        lines.append(f"| {number} | {name} | {figure} | {'' if delta is None else f'{delta:+.2f}'} |")
    lines += ["", f"Figures: {card.metric}, from {card.figures_from}.", ""]
    lines += [f"Compute: {COMPUTE[card.compute]}.", ""]
    lines += ["| | the paper | here |", "|---|---|---|"]
    for name in Setup.__dataclass_fields__:
        lines.append(f"| {name} | {getattr(card.setup, name)} | {(here or {}).get(name, '')} |")
    if card.differences:
        lines += ["", "Also different:", "", *(f"- {difference}" for difference in card.differences)]
    return lines
