"""T5 (Raffel et al., 2020): its architectures (Table 2), high-level objectives (Table 4), BERT-style
variants (Table 5), corruption rates (Table 6) and span lengths (Table 7), every row an encoder-decoder
(or another stack) made from `encdec_span` at the profile's size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from, max_len_for, model_fields

PAPER = "T5 (Raffel et al., 2020)"
MODEL = "encdec_span"  # the model (of params.yaml or the profile) that T5's rows are made from
SPAN, BERT_STYLE = "objectives.span", "objectives.bert_style"
IID = {f"{SPAN}.noise_mask": "iid"}
IID_ARGS = {
    "span": {"noise_mask": "iid"},
    "lm": {},
}  # T5's tables draw i.i.d. noise; random_spans is its final choice
SETUP = Setup(
    model="the T5 baseline: encoder and decoder of 12 layers × 768 each (220 M), pre-LN, RMSNorm, "
    "relative position bias",
    data="C4",
    steps="2^19 steps of 128 sequences × 512 tokens (2^35 ≈ 34 B tokens)",
    tokenizer="SentencePiece, 32k pieces",
    evaluation="GLUE average over its tasks, one run a row",
)
FIGURES = "the paper's table (GLUE column)"
SAME_STEPS = "every row trains the same steps, as T5's (its Tables 4-7 hold steps, not FLOPs)"


def from_t5_model(name: str, objective: str, **values: Any) -> dict[str, Any]:
    return {**made_from(MODEL, name, objective=objective), **values}


def densities(params: Mapping[str, Any]) -> list[Row]:
    """T5's corruption rates, i.i.d.: at 50 % the targets (a sentinel before each noise span) outgrow
    the row, so the rows' max_len holds what each reads."""
    own = model_fields(params, MODEL, "span_density")["max_len"]  # checks that the model is there
    rows = []
    for rate, figure in ((0.10, 82.82), (0.15, 83.28), (0.25, 83.00), (0.50, 81.27)):
        point = {MODELS_KEY: MODEL, f"{SPAN}.noise_density": rate, **IID}
        max_len = max_len_for(params, MODEL, "encoder_decoder", "span", noise_density=rate, noise_mask="iid")
        if max_len > own:
            point[f"++models.{MODEL}.max_len"] = max_len
        rows.append(Row(f"{rate:.0%}", point, figure, rate == 0.15))
    return rows


def architectures(params: Mapping[str, Any]) -> list[Row]:
    """Five architectures × two objectives (i.i.d. denoising, as T5 drew it, and the prefix LM
    objective), each made from `encdec_span` at the profile's size: the same stack depth everywhere,
    half of it in each of the half-depth encoder-decoder's two stacks; a decoder-only model reads a
    row's inputs and targets as one sequence, so its `max_len` holds both."""
    half = max(1, model_fields(params, MODEL, "t5_architectures")["n_layers"] // 2)
    stacks = (  # T5's row name, ours, the changes, its cost (M: the encoder-decoder's FLOPs)
        ("Encoder-decoder", "encdec", {}, 1.0),
        ("Enc-dec, shared", "encdec_shared", {"share_encoder_decoder": True}, 1.0),
        ("Enc-dec, 6 layers", "encdec_half", {"n_layers": half, "n_decoder_layers": half}, 0.5),
        ("Language model", "decoder", {"arch": "decoder"}, 1.0),
        ("Prefix LM", "prefix_lm", {"arch": "prefix_lm"}, 1.0),
    )
    figures = {
        "denoise": (83.28, 82.81, 80.88, 74.70, 81.82),
        "lm": (79.56, 79.60, 78.67, 73.78, 79.68),
    }
    rows = []
    for objective, suffix, said in (("span", "denoise", "denoising"), ("lm", "lm", "LM")):
        for (name, stack, changes, cost), figure in zip(stacks, figures[suffix], strict=True):
            spec = {"objective": objective, **changes}
            if "arch" in changes:  # the points' denoising is i.i.d.
                spec["max_len"] = max_len_for(
                    params, MODEL, changes["arch"], objective, **IID_ARGS[objective]
                )
            point = {**made_from(MODEL, f"{stack}_{suffix}", **spec), **IID}
            star = stack == "encdec" and objective == "span"
            rows.append(Row(f"{name}, {said}", point, figure, star, cost))
    return rows


CARDS = (
    Card(
        preset="t5_architectures",
        paper=PAPER,
        digits=2,
        table="Table 2 (architectures × objectives)",
        compares="encoder-decoder (2P parameters, cost M), shared (P, M), half depth (P, M/2), decoder-only "
        "LM (P, M) and prefix LM (P, M), each with denoising and with the prefix LM objective",
        metric="GLUE average",
        figures_from=FIGURES,
        compute="equal FLOPs",
        rows=architectures,
        setup=SETUP,
        differences=(
            "equal FLOPs, each row at the FLOPs the encoder-decoder spends on its steps (the half-depth "
            "rows at half: the table's M/2); T5 held the steps and gave each row its cost",
            "P and M counted by the project's own code at the profile's size (tests/test_flows.py)",
        ),
    ),
    Card(
        preset="t5_approaches",
        paper=PAPER,
        digits=2,
        table="Table 4 (high-level objectives)",
        compares="prefix language modelling, BERT-style denoising and deshuffling, on the encoder-decoder",
        metric="GLUE average",
        figures_from=FIGURES,
        compute="equal steps",
        rows=(
            Row("Prefix language modeling", from_t5_model("prefix_lm_encdec", "lm"), 80.69),
            Row("BERT-style", from_t5_model("bert_style", "bert_style"), 82.96, star=True),
            Row("Deshuffling", from_t5_model("deshuffling", "deshuffle"), 73.17),
        ),
        setup=SETUP,
        differences=(SAME_STEPS, "T5's table has no ★ row: BERT-style, the one it carried on with, is ours"),
    ),
    Card(
        preset="t5_objectives",
        paper=PAPER,
        digits=2,
        table="Table 5 (variants of the BERT-style objective)",
        compares="BERT-style (80/10/10, predict the whole row), MASS-style (100 % [MASK]), replace corrupted "
        "spans (sentinels, predict the spans) and drop corrupted tokens, 15 % i.i.d.",
        metric="GLUE average",
        figures_from=FIGURES,
        compute="equal steps",
        rows=(
            Row("BERT-style", from_t5_model("bert_style", "bert_style"), 82.96),
            Row(
                "MASS-style",
                from_t5_model(
                    "mass_style",
                    "bert_style",
                    **{f"{BERT_STYLE}.mask_fraction": 1.0, f"{BERT_STYLE}.random_fraction": 0.0},
                ),
                82.32,
            ),
            Row("Replace corrupted spans", from_t5_model("replace_spans", "span", **IID), 83.28, star=True),
            Row("Drop corrupted tokens", from_t5_model("drop", "drop"), 84.44),
        ),
        setup=SETUP,
        differences=(SAME_STEPS,),
    ),
    Card(
        preset="span_density",
        paper=PAPER,
        digits=2,
        table="Table 6 (corruption rate)",
        compares="the share of tokens corrupted, i.i.d., replaced by sentinels",
        metric="GLUE average",
        figures_from=FIGURES,
        compute="equal steps",
        rows=densities,
        setup=SETUP,
        differences=(SAME_STEPS,),
    ),
    Card(
        preset="span_length",
        paper=PAPER,
        digits=2,
        table="Table 7 (corrupted span length)",
        compares="i.i.d. corruption against spans of mean length 2, 3, 5 and 10, 15 % of the tokens",
        metric="GLUE average",
        figures_from=FIGURES,
        compute="equal steps",
        rows=(
            Row("Baseline (i.i.d.)", {MODELS_KEY: MODEL, **IID}, 83.28, star=True),
            *(
                Row(
                    str(length),
                    {
                        MODELS_KEY: MODEL,
                        f"{SPAN}.noise_mask": "random_spans",
                        f"{SPAN}.mean_span_length": length,
                    },
                    figure,
                )
                for length, figure in ((2, 83.54), (3, 83.49), (5, 83.40), (10, 82.85))
            ),
        ),
        setup=SETUP,
        differences=(SAME_STEPS,),
    ),
)
