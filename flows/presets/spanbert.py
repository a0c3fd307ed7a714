"""SpanBERT (Joshi et al., 2020): its masking schemes (Table 6) and auxiliary objectives (Table 7), on
`encoder_mlm`; its headline (Table 2) is question answering, which lmpipe does not evaluate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, on_segment_pairs

MLM = "objectives.mlm"
SETUP = Setup(
    model="BERT-Large's shape: 24 × 1024",
    data="BooksCorpus and Wikipedia",
    steps="the ablations' checkpoints at 1.2 M steps of 256 × 512",
    tokenizer="WordPiece 30k (cased)",
    evaluation="dev sets; the GLUE average of its Table 6 and 7 (it also reports SQuAD 2.0, NewsQA, "
    "TriviaQA, coreference)",
)


def scheme(params: Mapping[str, Any], name: str, unit: str, two: bool, boundary: bool) -> dict[str, Any]:
    """`encoder_mlm` masking by `unit`, on BERT's segment pairs with next-sentence prediction (`two`, its
    Table 6's bi-sequence rows) or on single contiguous segments, with or without the boundary objective."""
    values = {f"{MLM}.mask_unit": unit, f"{MLM}.boundary_loss": boundary}
    if not two:
        return {MODELS_KEY: {name: {"from": "encoder_mlm"}}, **values}
    model = on_segment_pairs(params, "encoder_mlm")
    return {MODELS_KEY: {name: model}, "pack.sentences": True, f"{MLM}.pair_loss": "nsp", **values}


def masking_schemes(params: Mapping[str, Any]) -> list[Row]:
    return [
        Row("Subword Tokens", scheme(params, "encoder_tokens", "token", True, False), 83.2, star=True),
        Row("Whole Words", scheme(params, "encoder_words", "word", True, False), 82.9),
        Row("Geometric Spans", scheme(params, "encoder_spans", "span", True, False), 83.4),
    ]


def objectives(params: Mapping[str, Any]) -> list[Row]:
    return [
        Row("Span Masking (2seq) + NSP", scheme(params, "spans_2seq_nsp", "span", True, False), 83.4),
        Row("Span Masking (1seq)", scheme(params, "spans_1seq", "span", False, False), 83.8),
        Row("Span Masking (1seq) + SBO", scheme(params, "spanbert", "span", False, True), 84.0, star=True),
    ]


PAPER = "SpanBERT (Joshi et al., 2020)"
CARDS = (
    Card(
        preset="span_masking",
        paper=PAPER,
        table="Table 6 (masking schemes)",
        compares="BERT's subword tokens, whole words and SpanBERT's geometric spans of whole words, each "
        "on segment pairs with next-sentence prediction",
        metric="GLUE dev average",
        figures_from="the paper's Table 6; its named-entity and noun-phrase rows need a tagger and a "
        "parser and are left out. The seeds quote its Table 2 (MRQA F1: BERT-1seq 79.7, SpanBERT 81.5)",
        compute="equal steps",
        rows=masking_schemes,
        setup=SETUP,
        differences=("Table 6 has no ★ row: subword tokens, BERT's masking, is ours",),
    ),
    Card(
        preset="span_objectives",
        paper=PAPER,
        table="Table 7 (auxiliary objectives)",
        compares="span masking on segment pairs with next-sentence prediction, on single segments, and on "
        "single segments with the span-boundary objective (SpanBERT as built)",
        metric="GLUE dev average",
        figures_from="the paper's Table 7",
        compute="equal steps",
        rows=objectives,
        setup=SETUP,
        differences=(
            "a single segment is a window of the packed stream (full_sentences), which may cross "
            "documents; SpanBERT's stays within one",
        ),
    ),
)
