"""Multi-token prediction (Gloeckle et al., 2024; DeepSeek-V3, 2024): next-token prediction against one
and two tokens more at every position, in Gloeckle et al.'s parallel heads and DeepSeek-V3's sequential
modules, at equal FLOPs."""

from __future__ import annotations

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from


def mtp(form: str, depth: int) -> dict:
    return {
        **made_from("decoder_clm", "decoder_mtp", objective="mtp"),
        "objectives.mtp.form": form,
        "objectives.mtp.depth": depth,
    }


CARDS = (
    Card(
        preset="mtp",
        paper="Multi-token prediction (Gloeckle et al., 2024; DeepSeek-V3, 2024)",
        table="Gloeckle et al.'s natural-language runs; DeepSeek-V3's Table 4 (its MTP ablation)",
        compares="next-token prediction against predicting 1 and 2 tokens more at every position, with "
        "Gloeckle et al.'s parallel heads on a shared trunk and DeepSeek-V3's sequential modules, the "
        "heads' FLOPs counted",
        metric="GLUE dev average",
        figures_from="no row has a figure in this metric: neither paper fine-tunes on GLUE. The seeds (003) "
        "give both forms' diagrams and Gloeckle et al.'s loss, no figures. Gloeckle et al. measure code "
        "benchmarks, and on natural language multiple-choice and summarisation tasks at 7 B parameters; "
        "DeepSeek-V3's Table 4 ablates D = 1 on its own benchmark suite (not read for this card)",
        compute="equal FLOPs",
        rows=(
            Row("next-token prediction", {MODELS_KEY: "decoder_clm"}, star=True),
            Row("parallel heads, n = 2", mtp("parallel", 1)),
            Row("parallel heads, n = 3", mtp("parallel", 2)),
            Row("sequential modules, D = 1 (DeepSeek-V3's)", mtp("sequential", 1)),
            Row("sequential modules, D = 2", mtp("sequential", 2)),
        ),
        setup=Setup(
            model="Gloeckle et al.: decoders of 0.3 to 13 B parameters (7 B on natural language); "
            "DeepSeek-V3: its MoE models with MLA (not checked for this card)",
            data="Gloeckle et al.: code and natural-language corpora of 200 B tokens and more; DeepSeek-V3: "
            "its own corpus (not checked for this card)",
            steps="the papers' budgets (not checked for this card)",
            tokenizer="the papers' BPE vocabularies",
            evaluation="generative code benchmarks, multiple-choice and summarisation tasks (Gloeckle et "
            "al.); DeepSeek-V3's benchmark suite",
        ),
        differences=(
            "the next token's head is the model's last block (Gloeckle et al.'s released code), so the "
            "parallel rows' trunk has L - 1 blocks and each deeper head one block more than the ★ row; "
            "that cost, and the sequential modules', is paid in steps at equal FLOPs",
            "the sequential rows' λ is 0.3 / D throughout (DeepSeek-V3 lowers it to 0.1 after 10 T tokens)",
            "an MTP row's `final train loss` is the step's sum (the next token's loss and the weighted "
            "deeper ones), not the next token's, which is its `val/loss` (MLflow, metrics/pretrain)",
            "dense decoders fine-tuned on GLUE through their last token's state, not the papers' "
            "generative evaluations; the extra heads and modules are dropped after pretraining, as "
            "DeepSeek-V3 drops its MTP modules for inference",
        ),
    ),
)
