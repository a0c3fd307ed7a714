"""Transformer-XL (Dai et al., 2019): segment-level recurrence with relative positions against a vanilla
segment model, at equal FLOPs, with the validation loss by evaluation context length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from, seq_len_of


def rows(params: Mapping[str, Any]) -> list[Row]:
    """Every row on consecutive segments of the same streams, measured at context lengths from half a
    segment to eight: the vanilla model up to its max_len, Transformer-XL's through its memory."""
    length = seq_len_of(params, "decoder_clm")
    measured = {
        "pretrain.sampling": "stream",
        "pretrain.context_lengths": [length // 2, length, 2 * length, 4 * length, 8 * length],
    }

    def xl(mem_len: int) -> dict[str, Any]:
        return {**made_from("decoder_clm", "decoder_xl", positions="xl", mem_len=mem_len), **measured}

    return [
        Row(
            "vanilla segment model (absolute positions, no memory)",
            {MODELS_KEY: "decoder_clm", **measured},
            star=True,
        ),
        Row("relative positions, no recurrence", xl(0)),
        Row("Transformer-XL: recurrence, memory of one segment", xl(length)),
        Row("Transformer-XL: memory of two segments", xl(2 * length)),
    ]


CARDS = (
    Card(
        preset="transformer_xl",
        paper="Transformer-XL (Dai et al., 2019)",
        table="its ablation of recurrence and relative positions; its evaluation at longer contexts",
        compares="a vanilla decoder trained on segments (absolute positions, no memory) against "
        "Transformer-XL's relative positions without and with segment-level recurrence, at equal FLOPs, "
        "each measured at evaluation context lengths up to 8 segments",
        metric="validation perplexity by evaluation context length (the report's context table and plot); "
        "the GLUE dev average beside it",
        figures_from="no row has a figure: the seeds (003) give the vanilla model's and Transformer-XL's "
        "training and evaluation diagrams without numbers, and the paper's ablation on WikiText-103 "
        "(perplexity by encoding, recurrence and attention length) was not read for this card",
        compute="equal FLOPs",
        rows=rows,
        setup=Setup(
            model="Transformer-XL on WikiText-103 and enwik8, 12 to 24 layers (not checked for this card)",
            data="WikiText-103, enwik8, text8, One Billion Word, Penn Treebank",
            steps="the paper's budgets (not checked for this card)",
            tokenizer="words (WikiText-103, adaptive softmax) and characters (enwik8)",
            evaluation="test perplexity, with a memory longer than in training",
        ),
        differences=(
            "every row reads Transformer-XL's ordered batches (pretrain.sampling: stream), the vanilla "
            "row too, so the rows differ in the model alone",
            "the profile's decoder (pre-LN, GELU); Transformer-XL's code is post-LN with ReLU, an "
            "embedding scale and an adaptive softmax, none of which are here",
            "the vanilla row is evaluated on non-overlapping segments of each length up to its max_len, "
            "not with the paper's sliding window of one prediction a segment",
            "recurrence with absolute positions (the paper's row showing they cannot be reused) is not a "
            "row: a memory needs positions: xl here",
        ),
    ),
)
