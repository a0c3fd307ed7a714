"""Parameter-efficient fine-tuning (the seeds' 003, "Lightweight Finetuning"): full fine-tuning against
Pfeiffer's and Houlsby's adapters, LoRA and AdaMix's mixture of adapters, on one pretrained encoder,
each at the share of the weights it trains in the paper's table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, model_fields

PAPER_WIDTH = 1024  # RoBERTa-large's d_model: the table's sizes are for 24 layers of it


def scaled(size: int, d_model: int) -> int:
    """A rank or bottleneck of the paper's at our width: an adapter's weights are 2·d·b a layer and a
    block's 12·d², so b/d (and LoRA's r/d) is the share of the blocks' weights it trains, at any depth."""
    return max(1, round(size * d_model / PAPER_WIDTH))


def method(name: str, **options: Any) -> dict[str, Any]:
    point: dict[str, Any] = {MODELS_KEY: "encoder_mlm", "finetune.method": name}
    return point | {f"finetune.methods.{name}.{key}": value for key, value in options.items()}


def peft_rows(params: Mapping[str, Any]) -> list[Row]:
    """The table's rows on the profile's encoder: each bottleneck and rank scaled to its width, so that
    every row trains the share of the transformer blocks' weights it trains on RoBERTa-large."""
    d_model = model_fields(params, "encoder_mlm", "peft")["d_model"]
    return [
        Row("Full Fine-tuning (355.0M)", method("full"), 88.9, star=True),
        Row("Pfeiffer Adapter (3.0M)", method("pfeiffer", bottleneck=scaled(64, d_model)), 88.4),
        Row("Pfeiffer Adapter (0.8M)", method("pfeiffer", bottleneck=scaled(16, d_model)), 87.9),
        Row("Houlsby Adapter (6.0M)", method("houlsby", bottleneck=scaled(64, d_model)), 87.8),
        Row("Houlsby Adapter (0.8M)", method("houlsby", bottleneck=scaled(8, d_model)), 86.4),
        Row("LoRA (0.8M)", method("lora", rank=scaled(8, d_model), alpha=16.0), 88.6),
        Row(
            "AdaMix Adapter (0.8M)",
            method("adamix", bottleneck=scaled(16, d_model), experts=4, share_up=True),
            89.9,
        ),
    ]


CARDS = (
    Card(
        preset="peft",
        paper="AdaMix (Wang et al., 2022), with the rows marked † from LoRA (Hu et al., 2021)",
        table="the GLUE table of RoBERTa-large (the seeds' 003, Parameter-Efficient Finetuning: Low-Rank "
        "Adaptation)",
        compares="full fine-tuning against Pfeiffer's and Houlsby's adapters (two sizes each), LoRA and "
        "AdaMix's mixture of adapters, the pretrained weights frozen in all but the first",
        metric="GLUE dev average (the report's; the paper's is over MNLI, SST-2, MRPC, CoLA, QNLI, QQP, "
        "RTE and STS-B)",
        figures_from="the seeds (003), which quote the table's Avg. column and its trained parameters; "
        "the per-task columns are cut off there",
        compute="fine-tuning only",
        rows=peft_rows,
        setup=Setup(
            model="RoBERTa-large, 24 × 1024, 355 M parameters",
            data="RoBERTa's pretraining (160 GB)",
            steps="each method's own fine-tuning recipe (LoRA and AdaMix: 20 epochs and more on the small "
            "tasks, lr 3e-4 to 4e-4; full fine-tuning lr 1e-5 to 3e-5)",
            tokenizer="byte-level BPE, 50k",
            evaluation="GLUE dev, the median of 5 seeds (LoRA) and of 5 runs (AdaMix)",
        ),
        differences=(
            "one pretrained encoder for every row (the run cache serves it); each rank and bottleneck is "
            "the paper's times d_model / 1024 (at least 1), the same share of the blocks' weights, so the "
            "counts in the report are our encoder's, not the table's",
            "every row at the profile's fine-tuning lr and epochs; the papers tuned each method's "
            "(finetune.methods.<method>.lr sets one per method)",
            "LoRA adapts the fused q, k, v projection (A shared by the three), with as many weights as "
            "the paper's LoRA on W_q and W_v apart at the same rank",
            "AdaMix: no consistency loss between two routes (microsoft/AdaMix's use_consistency_loss); "
            "its 0.8 M counts the merged adapter, the report counts every expert it trains",
            "each scratch baseline is a random encoder frozen the same way, with the row's method trained",
        ),
    ),
)
