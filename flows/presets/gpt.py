"""GPT-1 (Radford et al., 2018): fine-tuning with and without the auxiliary LM loss."""

from __future__ import annotations

from flows.presets import MODELS_KEY, Card, Row, Setup

WEIGHT = "finetune.common.lm_loss_weight"

CARDS = (
    Card(
        preset="gpt1_aux_loss",
        paper="GPT-1 (Radford et al., 2018)",
        table="Table 5 (ablations)",
        compares="fine-tuning with the LM loss of the input kept at weight λ 0.5, and without it",
        metric="the average of its 9 tasks' scores",
        figures_from="the paper's Table 5 (not in the seeds, which say 'use combined loss'): Transformer w/ "
        "aux LM 74.7, w/o aux LM 75.0",
        compute="fine-tuning only",
        rows=(
            Row("Transformer w/ aux LM (full)", {MODELS_KEY: "decoder_clm", WEIGHT: 0.5}, 74.7, star=True),
            Row("Transformer w/o aux LM", {MODELS_KEY: "decoder_clm", WEIGHT: 0.0}, 75.0),
        ),
        setup=Setup(
            model="12 × 768 decoder, 117 M parameters, post-LN",
            data="BooksCorpus",
            steps="100 epochs of 64 × 512",
            tokenizer="BPE, 40k merges",
            evaluation="9 tasks (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, and others), test and dev",
        ),
        differences=("one pretrained decoder for both rows (the run cache serves it)",),
    ),
)
