"""BERT (Devlin et al., 2019): its masking procedures (Table 8) and model sizes (Table 6), and the
ablations the seeds' BERT notes attribute to it (masking rate, positions, depth against width, pooling):
the paper has none of them, so their cards set no figure beside and say so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from, model_fields

PAPER = "BERT (Devlin et al., 2019)"
MLM = "objectives.mlm"
POOLING = "finetune.common.pooling.encoder"
SETUP = Setup(
    model="BERT-Base: 12 layers × 768, 12 heads, 110 M parameters, post-LN",
    data="BooksCorpus and English Wikipedia, 3.3 B words",
    steps="1 M steps of 256 sequences × 512 tokens (128 tokens for the first 90 %), about 40 epochs",
    tokenizer="WordPiece, 30,522 pieces",
    evaluation="dev sets, each task fine-tuned at its best of four learning rates",
)
NOT_IN_THE_PAPER = (
    "none: BERT's paper has no such table (its ablations: Table 5, the pre-training tasks; Table 6, model "
    "size; Table 7, feature-based; Table 8, the masking procedures). The seeds' BERT notes quote {quoted} "
    "as BERT's; they are not in it, so no figure is set beside"
)


def sizes(params: Mapping[str, Any]) -> list[Row]:
    """BERT's Table 6 at the profile's size: `encoder_mlm` stands for 12/768/12; each row scales its
    layers by L/12, its width by H/768 (rounded to a multiple of its heads) and its heads by A/12 (at
    least one each; its MLP 4× its width, as BERT's). At `tiny` (2 layers, 2 heads) the first three
    rows round to one layer: run the ladder at `small` or larger."""
    fields = model_fields(params, "encoder_mlm", "bert_size")
    table = (  # L, H, A, MNLI-m, MRPC, SST-2 (dev accuracy)
        (3, 768, 12, 77.9, 79.8, 88.4),
        (6, 768, 3, 80.6, 82.2, 90.7),
        (6, 768, 12, 81.9, 84.8, 91.3),
        (12, 768, 12, 84.4, 86.7, 92.9),
        (12, 1024, 16, 85.7, 86.9, 93.3),
        (24, 1024, 16, 86.6, 87.8, 93.7),
    )
    rows = []
    for layers, width, heads, mnli, mrpc, sst2 in table:
        n_heads = max(1, round(fields["n_heads"] * heads / 12))
        d_model = max(n_heads, round(fields["d_model"] * width / 768 / n_heads) * n_heads)
        size = {"n_layers": max(1, round(fields["n_layers"] * layers / 12)), "d_model": d_model}
        size |= {"n_heads": n_heads, "d_ff": 4 * d_model}
        point = made_from("encoder_mlm", f"encoder_L{layers}_H{width}_A{heads}", **size)
        star = (layers, width, heads) == (12, 768, 12)
        rows.append(Row(f"L {layers}, H {width}, A {heads}", point, round((mnli + mrpc + sst2) / 3, 2), star))
    return rows


def depth_width(params: Mapping[str, Any]) -> list[Row]:
    """12 × 768 against 6 × 1088 at the profile's size: `encoder_mlm` as it is, and half its layers with
    its width (and MLP) times 1088/768, rounded to a multiple of twice its heads (so that the head size
    stays even, as rotary positions need)."""
    fields = model_fields(params, "encoder_mlm", "depth_width")
    step = 2 * fields["n_heads"]
    wide = {
        "n_layers": max(1, fields["n_layers"] // 2),
        "d_model": max(step, round(fields["d_model"] * 1088 / 768 / step) * step),
        "d_ff": round(fields["d_ff"] * 1088 / 768),
    }
    return [
        Row("12 × 768", {MODELS_KEY: "encoder_mlm"}, star=True),
        Row("6 × 1088", made_from("encoder_mlm", "encoder_wide", **wide)),
    ]


def masking(mask: float, same: float, random: float) -> dict[str, Any]:
    """BERT's Table 8 row: of the selected tokens, `mask` become [MASK], `random` a random token, `same`
    stay (the rest)."""
    assert abs(mask + same + random - 1.0) < 1e-9
    return {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_fraction": mask, f"{MLM}.random_fraction": random}


CARDS = (
    Card(
        preset="masking_rate",
        paper=PAPER,
        table="no table: BERT masks 15 %; 40 % is Wettig et al. (2023)",
        compares="the share of tokens selected for the masked LM",
        metric="GLUE average",
        figures_from=NOT_IN_THE_PAPER.format(quoted="a 'Table 5' of 79.3, 80.5, 80.1, 79.6 GLUE at 10-25 %")
        + ". Wettig et al. (2023), 'Should You Mask 15% in Masked Language Modeling?', found larger "
        "models better off at 40 %",
        compute="equal steps",
        rows=tuple(
            Row(f"{rate:.0%}", {MODELS_KEY: "encoder_mlm", f"{MLM}.mask_rate": rate}, star=rate == 0.15)
            for rate in (0.10, 0.15, 0.20, 0.25, 0.40)
        ),
        setup=SETUP,
    ),
    Card(
        preset="mask_split",
        paper=PAPER,
        table="Table 8 (Appendix C.2, the masking procedures)",
        compares="what becomes of the 15 % selected tokens: [MASK] / kept / a random token",
        metric="MNLI-m dev accuracy",
        figures_from="the paper's Table 8 (MNLI dev; it also reports NER, where 100 % [MASK] loses 0.9 "
        "feature-based). The seeds' notes quote 78.9 against 80.5 GLUE for 100 % [MASK], which the paper "
        "does not have",
        compute="equal steps",
        rows=(
            Row("MASK 80 %, SAME 10 %, RND 10 %", masking(0.8, 0.1, 0.1), 84.2, star=True),
            Row("MASK 100 %", masking(1.0, 0.0, 0.0), 84.3),
            Row("MASK 80 %, RND 20 %", masking(0.8, 0.0, 0.2), 84.1),
            Row("MASK 80 %, SAME 20 %", masking(0.8, 0.2, 0.0), 84.4),
            Row("SAME 20 %, RND 80 %", masking(0.0, 0.2, 0.8), 83.7),
            Row("RND 100 %", masking(0.0, 0.0, 1.0), 83.6),
        ),
        setup=SETUP,
        differences=(
            "BERT trained these rows as BERT-Base for 1 M steps; its fine-tuning and the NER "
            "feature-based columns are left out",
        ),
    ),
    Card(
        preset="bert_size",
        paper=PAPER,
        digits=2,  # averages of the paper's three figures
        table="Table 6 (model size)",
        compares="depth L, width H and heads A of the encoder, 3/768/12 up to BERT-Large's 24/1024/16",
        metric="the average of MNLI-m, MRPC and SST-2 dev accuracy",
        figures_from="the paper's Table 6, each an average over 5 fine-tuning restarts (it also reports the "
        "masked LM's perplexity on held-out data: 5.84 down to 3.23)",
        compute="equal steps",
        rows=sizes,
        setup=SETUP,
        differences=(
            "each row is scaled from the profile's encoder_mlm, which stands for 12/768/12 (layers × "
            "L/12, width × H/768, heads × A/12): the paper's absolute sizes are the `bert-base` and "
            "`bert-large` presets",
            "the rows train the same steps, as the paper's (its larger rows cost more FLOPs)",
        ),
    ),
    Card(
        preset="positions",
        paper=PAPER,
        table="no table: BERT learns its positions",
        compares="how the encoder knows positions: BERT's learned, the Transformer's sinusoidal, and the "
        "relative schemes the seeds teach (rotary, ALiBi, T5's bucketed bias)",
        metric="GLUE average",
        figures_from=NOT_IN_THE_PAPER.format(quoted="+0.7 GLUE for learned over sinusoidal positions"),
        compute="equal steps",
        rows=tuple(
            Row(name, made_from("encoder_mlm", f"encoder_{kind}", positions=kind), star=kind == "learned")
            for name, kind in (
                ("learned", "learned"),
                ("sinusoidal", "sinusoidal"),
                ("rotary (RoPE)", "rope"),
                ("ALiBi", "alibi"),
                ("relative bias (T5)", "relative"),
            )
        ),
        setup=SETUP,
    ),
    Card(
        preset="depth_width",
        paper=PAPER,
        table="no table: Table 6 varies size, with no 6 × 1088 row",
        compares="12 layers × 768 against 6 × 1088: about the same block weights",
        metric="GLUE average",
        figures_from=NOT_IN_THE_PAPER.format(quoted="12 × 768 at 80.5 against 6 × 1088 at 78.1 GLUE"),
        compute="equal FLOPs",
        rows=depth_width,
        setup=SETUP,
        differences=(
            "both rows scaled from the profile's encoder_mlm (half the layers, 1088/768 the width)",
        ),
    ),
    Card(
        preset="pooling",
        paper=PAPER,
        table="no table: BERT classifies from [CLS]",
        compares="the classifier's input: the [CLS] state, the mean or the max of the final states",
        metric="GLUE average",
        figures_from=NOT_IN_THE_PAPER.format(
            quoted="89.1, 88.3 and 87.7 (MNLI, QQP, SST-2) for [CLS], mean and max"
        ),
        compute="fine-tuning only",
        rows=tuple(
            Row(name, {MODELS_KEY: "encoder_mlm", POOLING: pooling}, star=pooling == "cls")
            for name, pooling in (("[CLS]", "cls"), ("mean", "mean"), ("max", "max"))
        ),
        setup=SETUP,
        differences=(
            "one pretrained encoder for every row (the run cache serves it); the scratch "
            "baselines are fine-tuned with each pooling too",
        ),
    ),
)
