"""BERT, GPT and T5 as their papers built them, side by side at equal FLOPs: BERT's Table 1 sets BERT-Base
beside OpenAI GPT at the same size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, model_fields, on_segment_pairs


def systems(params: Mapping[str, Any]) -> list[Row]:
    """Each system from its model of params.yaml (its size on the profile), with its paper's recipe:
    BERT's masked LM with next-sentence prediction on segment pairs, with segment embeddings, post-LN
    blocks and its prediction head (BertForPreTraining's computation: tests/test_reference.py);
    GPT-1's left-to-right LM in post-LN blocks, fine-tuned with its auxiliary LM loss at λ 0.5; T5's
    span corruption in pre-LN blocks with RMSNorm, no biases and its relative position bias."""
    for model in ("encoder_mlm", "decoder_clm", "encdec_span"):
        model_fields(params, model, "systems")  # each named, before any row is made
    bert = on_segment_pairs(params, "encoder_mlm", norm_position="post", lm_head="transform")
    gpt = {"from": "decoder_clm", "norm_position": "post"}
    t5 = {"from": "encdec_span", "norm": "rmsnorm", "bias": False, "positions": "relative"}
    return [
        Row(
            "BERT-Base",
            {MODELS_KEY: {"bert": bert}, "pack.sentences": True, "objectives.mlm.pair_loss": "nsp"},
            79.6,
            star=True,
        ),
        Row("OpenAI GPT", {MODELS_KEY: {"gpt": gpt}, "finetune.common.lm_loss_weight": 0.5}, 75.1),
        Row("T5-Base", {MODELS_KEY: {"t5": t5}, "objectives.span.noise_mask": "random_spans"}),
    ]


CARDS = (
    Card(
        preset="systems",
        paper="BERT (Devlin et al., 2019) and T5 (Raffel et al., 2020)",
        table="BERT's Table 1 (GLUE test: OpenAI GPT against BERT-Base)",
        compares="three systems as built: BERT (masked LM + next-sentence prediction), GPT-1 (left-to-right "
        "LM, auxiliary LM loss in fine-tuning), T5 (span corruption, encoder-decoder)",
        metric="GLUE test average over the tasks but WNLI (BERT's Table 1)",
        figures_from="BERT's Table 1, BERT-Base and OpenAI GPT, both about 110 M parameters; T5-Base's "
        "GLUE score (82.7, T5's Table 14) averages other tasks at another budget and is not set beside",
        compute="equal FLOPs",
        rows=systems,
        setup=Setup(
            model="BERT-Base and GPT-1: 12 × 768, 110 M parameters, post-LN; T5-Base: 12 + 12 layers × "
            "768, 220 M, pre-LN",
            data="BERT: BooksCorpus + Wikipedia; GPT-1: BooksCorpus; T5: C4",
            steps="BERT 1 M × 256 × 512; GPT-1 100 epochs of 64 × 512; T5-Base (final) 1 M × 2,048 × 512 "
            "(about 1 T tokens): not equal compute",
            tokenizer="WordPiece 30k; BPE 40k; SentencePiece 32k",
            evaluation="GLUE test, each system's own fine-tuning",
        ),
        differences=(
            "one tokenizer, corpus and recipe (lr, schedule, batch) for the three; equal training FLOPs, "
            "which the papers did not hold",
            "T5's MLP is ReLU (ours GELU) and its pretraining used dropout 0.1 (ours none)",
        ),
    ),
)
