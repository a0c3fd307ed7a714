"""UniLM (Dong et al., 2019) and UL2 (Tay et al., 2023): mixtures of objectives in one model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, max_len_for, model_fields


def one_stack(params: Mapping[str, Any], name: str, arch: str, objective: str) -> dict[str, Any]:
    """A model made from `encoder_mlm` (its size on the profile) as `arch` trained with `objective`, its
    max_len holding the longest row it reads."""
    max_len = max_len_for(params, "encoder_mlm", arch, objective)
    return {
        MODELS_KEY: {name: {"from": "encoder_mlm", "arch": arch, "objective": objective, "max_len": max_len}}
    }


def unilm(params: Mapping[str, Any]) -> list[Row]:
    model_fields(params, "encoder_mlm", "unilm")
    return [
        Row("GPT", one_stack(params, "unilm_gpt", "decoder", "clm"), 72.8),
        Row("BERT-LARGE", one_stack(params, "unilm_bert", "prefix_lm", "mlm"), 80.5, star=True),
        Row("UniLM", one_stack(params, "unilm", "prefix_lm", "unilm"), 80.8),
    ]


def ul2(params: Mapping[str, Any]) -> list[Row]:
    model_fields(params, "encdec_span", "ul2")
    made = {"from": "encdec_span"}
    return [
        Row(
            "Span corruption (T5)",
            {
                MODELS_KEY: {"ul2_sc": {**made, "objective": "span"}},
                "objectives.span.noise_mask": "random_spans",
            },
            star=True,
        ),
        Row("Prefix LM", {MODELS_KEY: {"ul2_plm": {**made, "objective": "lm"}}}),
        Row("UL2 (mixture of denoisers)", {MODELS_KEY: {"ul2": {**made, "objective": "ul2"}}}),
    ]


CARDS = (
    Card(
        preset="unilm",
        paper="UniLM (Dong et al., 2019)",
        table="Table 11 (GLUE test)",
        compares="one Transformer trained with UniLM's three self-attention masks (bidirectional, "
        "left-to-right, sequence-to-sequence) against the bidirectional masked LM alone (BERT) and the "
        "left-to-right LM alone (GPT)",
        metric="GLUE test score (the benchmark's average)",
        figures_from="the paper's Table 11 (the seeds quote it): GPT 72.8, BERT-LARGE 80.5, UniLM 80.8. "
        "UniLM has no ablation of its objectives: its rows are three systems",
        compute="equal FLOPs",
        rows=unilm,
        setup=Setup(
            model="BERT-LARGE's shape, 24 × 1024, 340 M; UniLM initialised from BERT-LARGE's weights; GPT "
            "is GPT-1 (12 × 768)",
            data="English Wikipedia and BookCorpus",
            steps="UniLM: trained on from BERT-LARGE's weights (its steps and batch not checked here)",
            tokenizer="WordPiece 28,996 (BERT's cased)",
            evaluation="GLUE test",
        ),
        differences=(
            "every row from scratch at equal FLOPs, on one stack: UniLM continued BERT-LARGE's training, "
            "and GPT is a smaller model from another paper",
            "UniLM's shares were 1/3 bidirectional, 1/3 sequence-to-sequence, 1/6 left-to-right and 1/6 "
            "right-to-left; here right-to-left is left out, its share left-to-right's (a third each)",
        ),
    ),
    Card(
        preset="ul2",
        paper="UL2 (Tay et al., 2023)",
        table="its comparison of objectives on the encoder-decoder",
        compares="T5's span corruption, the prefix LM and UL2's mixture of denoisers (R: spans of 3 and 8 "
        "at 15 %; X: spans of 3, 8 and 64 at 50 %, 64 at 15 %; S: the prefix LM), on the encoder-decoder",
        metric="GLUE average (UL2 reports SuperGLUE and generation tasks, relative to its baselines)",
        figures_from="not set beside: UL2's tables report SuperGLUE, generation and one-shot scores as "
        "relative gains over its T5 and causal-LM baselines, and were not read for this card",
        compute="equal steps",
        rows=ul2,
        setup=Setup(
            model="T5-Base-size encoder-decoder and decoder-only models (its ablations)",
            data="C4",
            steps="its ablations' budget (not read for this card)",
            tokenizer="SentencePiece 32k",
            evaluation="SuperGLUE, XSum, SGD, TOT, one-shot SuperGLUE and XSum",
        ),
        differences=(
            "UL2's mode tokens ([R], [X], [S] before the inputs) are left out, and its denoisers mix in "
            "equal shares",
            "its decoder-only rows and its CLM, SCLM and UniLM rows are not in this card",
        ),
    ),
)
