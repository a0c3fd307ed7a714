"""Ablation sweeps: a grid of params, every point a DVC experiment, one comparison at the end.

Commit a reproduced baseline first and only what the swept params reach re-runs. MLflow gets one
parent run for the sweep, one child per point tagged with its overridden values, and every stage run
of the point nested under that child. The comparison (markdown, csv, plots) goes to
reports/ablation/<sweep>/ and to the parent run. What sweeps share (points, pools, MLflow, the
command line): flows/sweep.py.

    python -m flows.ablation masking_rate
    python -m flows.ablation --grid '{"objectives.mlm.mask_rate": [0.1, 0.2], "pretrain.lr": [1e-3, 3e-4]}'
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
from prefect import flow, get_run_logger

from flows import profile as profiles
from flows.common import PipelineError
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
    points_at_once,
    set_overrides,
    text,
)
from lmpipe.layout import INITS
from lmpipe.params.project import Params
from lmpipe.params.schema import PARAMS_FILE, read_params_yaml
from lmpipe.runtime import StageError

MLM, SPAN, BERT_STYLE = "objectives.mlm", "objectives.span", "objectives.bert_style"
ELECTRA = "objectives.electra"
POOLING, LM_LOSS_WEIGHT = "finetune.common.pooling", "finetune.common.lm_loss_weight"
T5_MODEL = "encdec_span"  # the model (of params.yaml or the profile) that T5's and BART's rows are made from

Grid = dict[str, list[Any]] | list[dict[str, Any]]


def t5_architectures(params: Mapping[str, Any]) -> Grid:
    """T5's Table 2: five architectures × two objectives (i.i.d. denoising, as T5 drew it, and the
    prefix LM objective), each row made from `T5_MODEL` at the profile's size: the same stack depth
    everywhere, half of it in each of the half-depth encoder-decoder's two stacks; a decoder-only model
    reads a row's inputs and targets as one sequence, so its `max_len` holds both."""
    from lmpipe.params.models import ModelParams
    from lmpipe.params.pretrain import PretrainParams, longest_read, objectives_params

    models = params.get(MODELS_KEY) or {}
    if T5_MODEL not in models:
        raise PipelineError(f"preset t5_architectures: its rows are made from models.{T5_MODEL}, not found")
    base = ModelParams.model_validate(models[T5_MODEL])
    fields = base.config_fields()
    half = max(1, fields["n_layers"] // 2)
    seq_len = PretrainParams.model_validate({**(params.get("pretrain") or {}), **base.pretrain}).seq_len
    sections = dict(params.get("objectives") or {})
    sections["span"] = {**sections.get("span", {}), "noise_mask": "iid"}  # the points' denoising
    arguments = objectives_params(sections).model_dump()
    stacks = {
        "encdec": {},
        "encdec_shared": {"share_encoder_decoder": True},
        "encdec_half": {"n_layers": half, "n_decoder_layers": half},
        "decoder": {"arch": "decoder"},
        "prefix_lm": {"arch": "prefix_lm"},
    }
    points = []
    for objective, row in (("span", "denoise"), ("lm", "lm")):
        for stack, changes in stacks.items():
            spec = {"from": T5_MODEL, "objective": objective, **changes}
            if "arch" in changes:
                reads = longest_read(changes["arch"], objective, seq_len, arguments[objective])
                spec["max_len"] = max(fields["max_len"], reads)
            points.append({MODELS_KEY: {f"{stack}_{row}": spec}, f"{SPAN}.noise_mask": "iid"})
    return points


def depth_width(params: Mapping[str, Any]) -> Grid:
    """BERT's depth against width at equal FLOPs (12 × 768 against 6 × 1088), at the profile's size:
    `encoder_mlm` as it is, and half its layers with its width (and MLP) times 1088/768, rounded to a
    multiple of twice its heads (so that the head size stays even, as rotary positions need)."""
    from lmpipe.params.models import ModelParams

    models = params.get(MODELS_KEY) or {}
    if "encoder_mlm" not in models:
        raise PipelineError("preset depth_width: its rows are made from models.encoder_mlm, not found")
    fields = ModelParams.model_validate(models["encoder_mlm"]).config_fields()
    step = 2 * fields["n_heads"]
    wide = {
        "from": "encoder_mlm",
        "n_layers": max(1, fields["n_layers"] // 2),
        "d_model": max(step, round(fields["d_model"] * 1088 / 768 / step) * step),
        "d_ff": round(fields["d_ff"] * 1088 / 768),
    }
    return [{MODELS_KEY: "encoder_mlm"}, {MODELS_KEY: {"encoder_wide": wide}}]


def input_format(params: Mapping[str, Any]) -> Grid:
    """RoBERTa's Table 2: the encoder of `encoder_mlm` with BERT's segment embeddings, on the packed data
    with its sentence index, in each input format (the pairs with BERT's next-sentence prediction)."""
    models = params.get(MODELS_KEY) or {}
    if "encoder_mlm" not in models:
        raise PipelineError("preset input_format: its rows are made from models.encoder_mlm, not found")
    own = models["encoder_mlm"].get("pretrain") or {}
    return [
        {
            MODELS_KEY: {
                f"encoder_{fmt}": {
                    "from": "encoder_mlm",
                    "segment_embeddings": True,
                    "pretrain": {**own, "input_format": fmt},
                }
            },
            "pack.sentences": True,
        }
        for fmt in ("segment_pair", "sentence_pair", "full_sentences", "doc_sentences")
    ]


def albert(params: Mapping[str, Any]) -> Grid:
    """ALBERT's two parameter reductions on `encoder_mlm`, alone and together: its embeddings factorized
    at BERT-base's ratio E/H = 128/768 (rounded to a multiple of 8), and every layer one shared block."""
    from lmpipe.params.models import ModelParams

    models = params.get(MODELS_KEY) or {}
    if "encoder_mlm" not in models:
        raise PipelineError("preset albert: its rows are made from models.encoder_mlm, not found")
    d_model = ModelParams.model_validate(models["encoder_mlm"]).config_fields()["d_model"]
    factorized = {"embedding_size": max(8, round(d_model * 128 / 768 / 8) * 8)}
    shared = {"share_layers": "all"}
    rows = {"factorized": factorized, "shared": shared, "albert": {**factorized, **shared}}
    return [
        {MODELS_KEY: "encoder_mlm"},
        *(
            {MODELS_KEY: {f"encoder_{row}": {"from": "encoder_mlm", **changes}}}
            for row, changes in rows.items()
        ),
    ]


def from_t5_model(name: str, objective: str) -> dict[str, Any]:
    return {MODELS_KEY: {name: {"from": T5_MODEL, "objective": objective}}}


# Named after the seeds' tables (../shared/seeds): BERT Table 5 (10-25 %, and 40 %, where Wettig et al.
# 2023 found larger models better off) and its 80/10/10 ablation; the BERT, GPT and T5 systems side by
# side; T5's architectures × objectives, its objectives, corruption rates and span lengths; BART's noise;
# RoBERTa's input formats and static vs dynamic masking; positions; depth against width; ALBERT's
# factorized embeddings and shared layers; SpanBERT's spans; MAE-LM's decoder sizes; ELECTRA against the
# masked LM; BERT's
# poolings for fine-tuning;
# GPT-1's auxiliary LM loss.
# A preset is a grid, or a function of the params a point starts from (the profile's sizes); a point
# that leaves a swept key out keeps the params' value there.
PRESETS: dict[str, Grid | Callable[[Mapping[str, Any]], Grid]] = {
    "masking_rate": {MODELS_KEY: ["encoder_mlm"], f"{MLM}.mask_rate": [0.10, 0.15, 0.20, 0.25, 0.40]},
    "mask_split": [  # 100 % [MASK] vs BERT's 80/10/10
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_fraction": 1.0, f"{MLM}.random_fraction": 0.0},
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_fraction": 0.8, f"{MLM}.random_fraction": 0.1},
    ],
    "systems": {MODELS_KEY: ["encoder_mlm", "decoder_clm", "encdec_span"]},  # BERT, GPT and T5 as built
    "t5_architectures": t5_architectures,
    "t5_objectives": [
        from_t5_model("bert_style", "bert_style"),
        # T5's MASS-style: BERT-style without the random tokens
        {
            **from_t5_model("mass_style", "bert_style"),
            f"{BERT_STYLE}.mask_fraction": 1.0,
            f"{BERT_STYLE}.random_fraction": 0.0,
        },
        {**from_t5_model("replace_spans", "span"), f"{SPAN}.noise_mask": "iid"},
        from_t5_model("drop", "drop"),
    ],
    "span_density": {MODELS_KEY: [T5_MODEL], f"{SPAN}.noise_density": [0.10, 0.15, 0.25, 0.50]},
    "span_length": [
        {MODELS_KEY: T5_MODEL, f"{SPAN}.noise_mask": "iid"},
        *(
            {MODELS_KEY: T5_MODEL, f"{SPAN}.noise_mask": "random_spans", f"{SPAN}.mean_span_length": length}
            for length in (2, 3, 5, 10)
        ),
    ],
    "bart_noise": [
        {**from_t5_model("bart", "bart"), "objectives.bart.noise": noise}
        for noise in ("token_masking", "token_deletion", "text_infilling", "document_rotation")
    ],
    # RoBERTa's Table 1: BERT's static masks (10 copies) against fresh ones; both on epochs of fixed rows
    "masking": {
        MODELS_KEY: ["encoder_mlm"],
        "pretrain.sampling": ["epoch"],
        f"{MLM}.masking": ["static", "dynamic"],
    },
    # BERT's learned positions against sinusoidal ones, and the relative schemes the seeds teach
    "positions": [
        {MODELS_KEY: {f"encoder_{kind}": {"from": "encoder_mlm", "positions": kind}}}
        for kind in ("learned", "sinusoidal", "rope", "alibi", "relative")
    ],
    "depth_width": depth_width,
    "input_format": input_format,
    "albert": albert,
    # SpanBERT's masking schemes: BERT's tokens, whole words, geometric spans of whole words, and the
    # spans with the span-boundary objective beside the masked LM (SpanBERT as built)
    "span_masking": [
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_unit": "token", f"{MLM}.boundary_loss": False},
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_unit": "word", f"{MLM}.boundary_loss": False},
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_unit": "span", f"{MLM}.boundary_loss": False},
        {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_unit": "span", f"{MLM}.boundary_loss": True},
    ],
    # MAE-LM's table: BERT's masked LM against MAE-LM with its decoder of 2, 4 (MAE-LM's) and 6 layers,
    # the same steps each (as the paper's ablations)
    "mae_lm": [
        {MODELS_KEY: "encoder_mlm"},
        *(
            {
                MODELS_KEY: {"encoder_mae_lm": {"from": "encoder_mlm", "objective": "mae_lm"}},
                "objectives.mae_lm.decoder_layers": layers,
            }
            for layers in (2, 4, 6)
        ),
    ],
    # BERT's masked LM against ELECTRA's replaced-token detection at four generator widths (ELECTRA's
    # generator-size figure), at equal FLOPs with the generator's counted
    "electra": [
        {MODELS_KEY: "encoder_mlm"},
        *(
            {
                MODELS_KEY: {"encoder_electra": {"from": "encoder_mlm", "objective": "electra"}},
                f"{ELECTRA}.generator_width": width,
            }
            for width in (0.125, 0.25, 0.5, 1.0)
        ),
    ],
    # fine-tuning only: one pretrained encoder, its fine-tunes (and the scratch baselines) per pooling
    "pooling": {MODELS_KEY: ["encoder_mlm"], f"{POOLING}.encoder": ["cls", "mean", "max"]},
    "gpt1_aux_loss": {MODELS_KEY: ["decoder_clm"], LM_LOSS_WEIGHT: [0.5, 0.0]},
}
# the point every other point of a preset is compared with: the paper's ★ (BERT's 15 % and 80/10/10;
# T5's encoder-decoder with denoising, 15 %, i.i.d. spans replaced), or its chosen row (BART's infilling,
# RoBERTa's dynamic masking, BERT's [CLS], GPT-1's full recipe with the auxiliary LM loss)
BASELINES: dict[str, dict[str, Any]] = {
    "masking_rate": {f"{MLM}.mask_rate": 0.15},
    "mask_split": {f"{MLM}.mask_fraction": 0.8},
    "systems": {MODELS_KEY: T5_MODEL},
    "t5_architectures": {MODELS_KEY: "encdec_denoise"},
    "t5_objectives": {MODELS_KEY: "replace_spans"},
    "span_density": {f"{SPAN}.noise_density": 0.15},
    "span_length": {f"{SPAN}.noise_mask": "iid"},
    "bart_noise": {"objectives.bart.noise": "text_infilling"},
    "masking": {f"{MLM}.masking": "dynamic"},
    "positions": {MODELS_KEY: "encoder_learned"},
    "depth_width": {MODELS_KEY: "encoder_mlm"},
    "input_format": {MODELS_KEY: "encoder_segment_pair"},
    "albert": {MODELS_KEY: "encoder_mlm"},
    "electra": {MODELS_KEY: "encoder_mlm"},
    "span_masking": {f"{MLM}.mask_unit": "token"},
    "mae_lm": {"objectives.mae_lm.decoder_layers": 4},
    "pooling": {f"{POOLING}.encoder": "cls"},
    "gpt1_aux_loss": {LM_LOSS_WEIGHT: 0.5},
}
T5_TABLE_2 = "T5, Table 2"
# the papers' tables: what the paper measured for a point against its baseline row, in GLUE average
# points (MNLI accuracy for BART, whose table has no GLUE average; SST-2 for RoBERTa's): the seeds' (BERT's
# Table 5, 100 % [MASK], positions, depth and poolings; T5's Tables 2 and 4 and corruption rates; RoBERTa's
# masking and input formats), and three the seeds leave out, said so
PAPER_EFFECTS: dict[str, list[tuple[dict[str, Any], float, str]]] = {
    "masking_rate": [
        ({f"{MLM}.mask_rate": 0.10}, 79.3 - 80.5, "BERT, Table 5"),
        ({f"{MLM}.mask_rate": 0.20}, 80.1 - 80.5, "BERT, Table 5"),
        ({f"{MLM}.mask_rate": 0.25}, 79.6 - 80.5, "BERT, Table 5"),
    ],
    "mask_split": [({f"{MLM}.mask_fraction": 1.0}, 78.9 - 80.5, "BERT, 100 % [MASK]")],
    "systems": [({MODELS_KEY: "decoder_clm"}, 73.78 - 83.28, f"{T5_TABLE_2} (decoder-only LM)")],
    "t5_architectures": [
        ({MODELS_KEY: name}, glue - 83.28, f"{T5_TABLE_2} ({row})")
        for name, glue, row in (
            ("encdec_shared_denoise", 82.81, "enc-dec shared, denoising"),
            ("encdec_half_denoise", 80.88, "enc-dec 6 layers, denoising"),
            ("decoder_denoise", 74.70, "language model, denoising"),
            ("prefix_lm_denoise", 81.82, "prefix LM, denoising"),
            ("encdec_lm", 79.56, "encoder-decoder, LM"),
            ("encdec_shared_lm", 79.60, "enc-dec shared, LM"),
            ("encdec_half_lm", 78.67, "enc-dec 6 layers, LM"),
            ("decoder_lm", 73.78, "language model, LM"),
            ("prefix_lm_lm", 79.68, "prefix LM, LM"),
        )
    ],
    "t5_objectives": [
        ({MODELS_KEY: "bert_style"}, 82.96 - 83.28, "T5, Table 4 (BERT-style)"),
        ({MODELS_KEY: "mass_style"}, 82.32 - 83.28, "T5, Table 4 (MASS-style)"),
        ({MODELS_KEY: "drop"}, 84.44 - 83.28, "T5, Table 4 (drop corrupted tokens)"),
    ],
    "span_density": [
        ({f"{SPAN}.noise_density": 0.10}, 82.82 - 83.28, "T5, corruption rate"),
        ({f"{SPAN}.noise_density": 0.25}, 83.00 - 83.28, "T5, corruption rate"),
        ({f"{SPAN}.noise_density": 0.50}, 81.27 - 83.28, "T5, corruption rate"),
    ],
    "span_length": [
        ({f"{SPAN}.mean_span_length": length}, glue - 83.28, "T5, Table 6 (the paper's; not in the seeds)")
        for length, glue in ((2, 83.54), (3, 83.49), (5, 83.40), (10, 82.85))
    ],
    "bart_noise": [
        ({"objectives.bart.noise": noise}, mnli - 84.0, "BART, Table 1, MNLI (the paper's; not in the seeds)")
        for noise, mnli in (("token_masking", 84.1), ("token_deletion", 84.1), ("document_rotation", 75.3))
    ],
    "masking": [({f"{MLM}.masking": "static"}, 92.5 - 92.9, "RoBERTa, Table 1, SST-2 (MNLI-m +0.3)")],
    "positions": [({MODELS_KEY: "encoder_sinusoidal"}, -0.7, "BERT, learned vs sinusoidal positions")],
    "depth_width": [({MODELS_KEY: "encoder_wide"}, 78.1 - 80.5, "BERT, 6 × 1088 vs 12 × 768")],
    "input_format": [
        ({MODELS_KEY: f"encoder_{fmt}"}, sst2 - 92.9, f"RoBERTa, Table 2, SST-2 (MNLI-m {mnli - 84.0:+.1f})")
        for fmt, sst2, mnli in (
            ("sentence_pair", 92.1, 82.9),
            ("full_sentences", 92.5, 84.7),
            ("doc_sentences", 92.7, 84.7),
        )
    ],
    "albert": [
        (
            {MODELS_KEY: "encoder_albert"},
            80.1 - 82.3,
            "ALBERT, Table 2: ALBERT-base (E 128, all shared, SOP) vs BERT-base, 12 M vs 108 M parameters "
            "(SQuAD, MNLI, SST-2, RACE average)",
        )
    ],
    "span_masking": [
        (
            {f"{MLM}.mask_unit": "span", f"{MLM}.boundary_loss": True},
            81.5 - 79.7,
            "SpanBERT, Table 2: SpanBERT vs its BERT-1seq (single segments, token masking), MRQA average "
            "F1 (question answering, not GLUE)",
        )
    ],
    "mae_lm": [
        ({MODELS_KEY: "encoder_mlm"}, 85.2 - 86.1, "MAE-LM, Table 2: enc. w. [MASK] (MLM) vs MAE-LM-base"),
        ({"objectives.mae_lm.decoder_layers": 2}, 85.8 - 86.1, "MAE-LM, Table 2: 2-layer vs 4-layer decoder"),
        ({"objectives.mae_lm.decoder_layers": 6}, 84.8 - 86.1, "MAE-LM, Table 2: 6-layer vs 4-layer decoder"),
    ],
    "electra": [
        (
            {f"{ELECTRA}.generator_width": 0.25},
            79.9 - 75.1,
            "ELECTRA, Table 1 (the paper's; not in the seeds): ELECTRA-Small vs BERT-Small, both 14 M "
            "parameters and 1.4e18 training FLOPs, GLUE dev",
        )
    ],
    "pooling": [
        ({f"{POOLING}.encoder": pooling}, average - 89.1, "BERT, pooling (MNLI, QQP, SST-2 average)")
        for pooling, average in (("mean", 88.3), ("max", 87.7))
    ],
    "gpt1_aux_loss": [
        ({LM_LOSS_WEIGHT: 0.0}, 75.0 - 74.7, "GPT-1, Table 5, w/o aux LM (the paper's; not in the seeds)")
    ],
}
# presets whose points train at equal compute: every point gets the FLOPs the baseline point's model
# spends on its step budget, times its cost in COSTS (T5's Table 2: the half-depth encoder-decoder at
# M/2). T5's objective tables and BART's train every row for the same steps, as the papers did.
EQUAL_FLOPS = {"systems", "t5_architectures", "depth_width", "input_format", "albert", "electra"}
COSTS: dict[str, dict[str, float]] = {"t5_architectures": {"encdec_half_denoise": 0.5, "encdec_half_lm": 0.5}}


def cost(preset: str | None, point: Mapping[str, Any]) -> float:
    """A point's share of the equal-FLOPs budget (by the models it trains)."""
    return COSTS.get(preset or "", {}).get(text(point.get(MODELS_KEY, "")), 1.0)


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
    from lmpipe.pretraining import planned_train_flops

    baseline = points[base]
    if len(baseline.models) != 1:
        raise PipelineError(f"equal FLOPs: the baseline point trains {len(baseline.models)} models, not one")
    (model,) = baseline.models
    budget = planned_train_flops(baseline, model, baseline.tokenizer.vocab_size)
    steps = baseline.pretrain_of(model).max_steps
    for params in points:
        pretrain = params.pretrain.model_copy(update={"max_flops": budget})
        equal = params.model_copy(update={"pretrain": pretrain})
        for name in params.models:
            try:
                planned_train_flops(equal, name, params.tokenizer.vocab_size)
            except StageError as exc:
                raise PipelineError(f"equal FLOPs: {exc}") from None
    return float(budget), f"{budget:.3g} FLOPs each, what {model} spends on its {steps} steps"


def label(point: Mapping[str, Any], swept: Sequence[str]) -> str:
    """The swept values the point sets (one it leaves out keeps the params' value)."""
    shown = [f"{key.split('.')[-1]}={text(point[key])}" for key in swept if key in point]
    return ", ".join(shown) or "baseline"


def baseline_index(
    values: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any] | None, preset: str | None
) -> int:
    """The 0-based point every other point is compared with: the one matching `baseline` (by default the
    preset's, else the first point)."""
    wanted = baseline if baseline is not None else BASELINES.get(preset or "")
    if not wanted:
        return 0
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
) -> pd.DataFrame:
    """One row per (point, model): the swept values; GLUE average and tasks of the pretrained model
    (median over seeds) with their std over seeds; Δ against scratch with its interval and verdict (from
    the point's evaluate stage); Δ against the baseline point's model with interval and verdict (a paired
    bootstrap over the same dev examples, as `evaluate` does); the final pretraining loss."""
    from lmpipe.report.glue import read_aligned
    from lmpipe.report.significance import compare

    base_runs, _, base_idx = (
        read_aligned(results[baseline.index]["predictions"]) if baseline.index in results else ({}, {}, {})
    )
    rows = []
    for point in points:
        if point.index not in results:
            continue
        runs, labels, idx = read_aligned(results[point.index]["predictions"])
        for model, scores in results[point.index]["glue"].items():
            row: dict[str, Any] = {"experiment": point.experiment, "point": label(point.values, swept)}
            # a key the point leaves out: None, the params' value
            row.update({key: point.values.get(key) for key in swept})
            if MODELS_KEY in row and row[MODELS_KEY] is not None:
                row[MODELS_KEY] = text(row[MODELS_KEY])
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
            against = model if (model, "pretrained") in base_runs else _only_model(base_runs)
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


def power_lines(table: pd.DataFrame, preset: str | None, seeds: int) -> list[str]:
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
        for values, effect, source in PAPER_EFFECTS.get(preset or "", []):
            if not has_values(row, values) or row["vs_baseline_verdict"] != "within noise":
                continue
            size, dev_only, std = abs(effect), row["vs_baseline_detectable"], row["glue_average_std"]
            # detectable² = dev_only² + seed_term / seeds: the seeds' term is their variance, both points'
            seed_term = Z_DETECTABLE**2 * (std**2 + base_std**2) if seeds > 1 else float("nan")
            said = f"- `{row['experiment']}`: {source} measured {effect:+.1f}; this comparison detects "
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
    preset: str | None = None,
    seeds: int = 1,
    best: pd.DataFrame | None = None,
) -> str:
    from lmpipe.report.significance import METHOD

    tasks = task_columns(table)
    header = (
        f"# Ablation `{sweep}`\n\n"
        "GLUE validation ×100 of the pretrained models: the median over fine-tuning seeds ± the std over "
        f"seeds. Δ vs scratch: pretrained − scratch of the same point. Δ vs baseline: against point "
        f"`{label(baseline.values, swept)}` ({baseline.experiment}), the same model (or its only model). "
        f"Intervals are 95 %, from a {METHOD}; `better`/`worse` when the interval excludes 0; "
        "within noise, the effect that comparison detects 80 % of the time (2.8 standard errors).\n"
    )
    if compute:
        header += f"\nEqual compute: every point pretrains on a budget of {compute}.\n"
    if synthetic:
        header += "\n> **Synthetic data** (offline default profile): shows the pipeline, not the papers.\n"
    columns = ["experiment", *swept, "model", "GLUE average", *tasks, "scratch average", "Δ vs scratch"]
    columns += ["Δ vs baseline", "parameters", "pretrain steps", "pretrain FLOPs", "final train loss"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table.to_dict("records"):
        cells = [row["experiment"], *(cell(row.get(k)) for k in swept), row["model"]]
        cells += [f"{row['glue_average']:.2f} ± {row['glue_average_std']:.2f}"]
        cells += [f"{row[t]:.2f} ± {row[f'{t}_std']:.2f}" for t in tasks]
        cells += [f"{row['scratch_average']:.2f} ± {row['scratch_average_std']:.2f}"]
        cells += [_interval(row, "delta_average")]
        cells += [_interval(row, "vs_baseline"), f"{row['parameters'] / 1e6:.2f} M"]
        cells += [f"{row['pretrain_steps']}", f"{row['train_flops']:.3g}"]
        cells += [f"{row['final_train_loss']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per task, Δ vs baseline:", ""]
    lines += ["| experiment | model | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    for row in table.to_dict("records"):
        cells = [_interval(row, f"{t}_vs_baseline") for t in tasks]
        lines.append(f"| {row['experiment']} | {row['model']} | " + " | ".join(cells) + " |")
    power = power_lines(table, preset, seeds)
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


@flow(name="ablation", log_prints=True)
def ablation(
    preset: Annotated[str | None, Option(f"a named sweep: {', '.join(PRESETS)}", positional=True)] = None,
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
    points_spec = resolve_grid(preset, grid, sweep.params)
    values = expand(points_spec)
    if rows is not None:
        values, baseline = preset_rows(values, rows, baseline, preset)
    overrides = [sweep.overrides(point) for point in values]
    validated = [sweep.validate(point) for point in overrides]  # every point, up front
    keys = list(dict.fromkeys(key for point in values for key in point))
    swept = [key for key in keys if len({json.dumps(p.get(key), sort_keys=True) for p in values}) > 1]
    base = baseline_index(values, baseline, preset)
    compute = None
    if preset in EQUAL_FLOPS:
        budget, compute = equal_flops_budget(validated, base)
        overrides = [
            [*point_overrides_, f"pretrain.max_flops={budget * cost(preset, point)!r}"]
            for point, point_overrides_ in zip(values, overrides, strict=True)
        ]

    planned = [
        (point, point_overrides_, {f"param.{key}": text(value) for key, value in point.items()})
        for point, point_overrides_ in zip(values, overrides, strict=True)
    ]
    tags = {"preset": preset or ""}
    grid_params = {"grid": json.dumps(points_spec), "swept": ",".join(swept)}
    if set_params:
        grid_params["set_params"] = json.dumps(set_params)
    if rows is not None:
        grid_params["rows"] = json.dumps(rows)
    points = sweep.start(planned, tags, {}, grid_params, pool, git_remote, dvc_remote)
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
        sweep.finish_point(point, metrics, {k: text(v) for k, v in point.values.items()})

    seed = int(sweep.params.get("seed", 0))
    table = comparison(points, results, swept, points[base], seed)
    if len(table):
        synthetic = validated[0].glue.synthetic
        seeds = len(validated[base].finetune.seeds)
        # where only fine-tuning values vary, each init's best point is a comparison of its own
        finetuning = bool(swept) and all(key.startswith("finetune.") for key in swept)
        best = best_of_each_init(points, results, seed) if finetuning else None
        report = markdown(table, sweep.name, swept, synthetic, points[base], compute, preset, seeds, best)
        report += sweep.where_points_ran(points, results, failed)
        files = {
            "comparison.csv": table.to_csv(index=False),
            "comparison.md": report,
            "glue.png": plot_scores(table, swept),
            "pretrain_loss.png": plot_losses(points, results, swept),
        }
        if best is not None:
            files["best_of_each_init.csv"] = best.to_csv(index=False)
        sweep.publish(files, "comparison.md", "ablation-comparison")
        logger.info("comparison of %d points: %s\n%s", table["experiment"].nunique(), sweep.out, report)
    sweep.close({}, failed)
    return {
        "sweep": sweep.name,
        "report": str(sweep.out),
        "parent_run_id": sweep.parent,
        "rows": table.to_dict("records"),
    }


def resolve_grid(
    preset: str | None,
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | None,
    params: Mapping[str, Any],
) -> Any:
    """The grid given, or the preset's on the params its points start from."""
    if (preset is None) == (grid is None):
        raise PipelineError(f"give either a preset ({', '.join(PRESETS)}) or a grid, not both or neither")
    if preset is None:
        return grid
    if preset not in PRESETS:
        raise PipelineError(f"preset '{preset}' is unknown (presets: {', '.join(PRESETS)})")
    found = PRESETS[preset]
    return found(params) if callable(found) else found


def preset_rows(
    values: Sequence[dict[str, Any]],
    rows: Sequence[int],
    baseline: Mapping[str, Any] | None,
    preset: str | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The preset's points at `rows` (numbered from 1), and its baseline point among them:
    a table's rows at a budget that affords only some (the baseline and the row a paper's claim is about)."""
    if preset is None:
        raise PipelineError("--rows picks a preset's rows; with --grid give only the points to run")
    numbers = [row for row in rows if type(row) is int and 1 <= row <= len(values)]
    if not rows or len(set(numbers)) != len(rows):
        given, top = json.dumps(list(rows)), len(values)
        raise PipelineError(f"--rows {given}: give distinct row numbers from 1 to {top} (preset {preset})")
    base = baseline_index(values, baseline, preset) + 1
    if base not in rows:
        raise PipelineError(f"--rows {json.dumps(list(rows))}: the baseline, row {base}, must be among them")
    return [values[row - 1] for row in sorted(rows)], dict(values[base - 1])


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
    values = expand(resolve_grid(arguments["preset"], arguments["grid"], params))
    for point in values:
        point_overrides(point, params, params_file, origin)
    baseline = arguments["baseline"]
    if baseline is not None and not isinstance(baseline, dict):
        raise PipelineError('--baseline: give an object of values, e.g. {"pretrain.lr": 0.001}')
    baseline_index(values, baseline, arguments["preset"])


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(ablation, argv, check, lambda result: f"comparison: {result['report']}/comparison.md")


if __name__ == "__main__":
    sys.exit(main())
