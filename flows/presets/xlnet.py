"""XLNet (Yang et al., 2019): the permutation LM against BERT's masked LM at equal FLOPs on the same data,
and its own ablation rows (Table 6): K, memory, span-based prediction, bidirectional data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from, seq_len_of


def rows(params: Mapping[str, Any]) -> list[Row]:
    """Every row on ordered batches of the same streams (the ★ too), so that they differ in the model
    and the objective alone; XLNet's rows with a memory of one segment unless the row removes it."""
    length = seq_len_of(params, "encoder_mlm")
    ordered = {"pretrain.sampling": "stream"}

    def xl(objective: str, mem_len: int = length, **plm: Any) -> dict[str, Any]:
        name = "encoder_xlnet" if objective == "plm" else "encoder_dae_xl"
        model = made_from("encoder_mlm", name, objective=objective, positions="xl", mem_len=mem_len)
        return {**model, **ordered, **{f"objectives.plm.{key}": value for key, value in plm.items()}}

    return [
        Row("BERT-Base", {MODELS_KEY: "encoder_mlm", **ordered}, 92.8, star=True),
        Row("DAE + Transformer-XL", xl("mlm")),
        Row("XLNet-Base (K = 7)", xl("plm", k=7), 92.7),
        Row("XLNet-Base (K = 6)", xl("plm", k=6), 93.4),
        Row("- memory", xl("plm", mem_len=0, k=6)),
        Row("- span-based pred", xl("plm", k=6, span=False)),
        Row("- bidirectional data", xl("plm", k=6, bidirectional_data=False)),
    ]


CARDS = (
    Card(
        preset="xlnet",
        paper="XLNet (Yang et al., 2019)",
        table="Table 6 (the ablation study, XLNet-Base against BERT-Base)",
        compares="BERT's masked LM against a denoising autoencoder on Transformer-XL and XLNet's "
        "permutation LM (two-stream attention, partial prediction at K = 7 and 6), then K = 6 without "
        "its memory, without span-based prediction and without bidirectional data, at equal FLOPs on "
        "the same data",
        metric="SST-2 dev accuracy (the seeds also give MNLI-m: BERT-Base 84.3, K = 7 85.8, K = 6 85.6; "
        "SQuAD 2.0 and RACE)",
        figures_from="rows 1, 3 and 4 of Table 6 as the seeds (003) quote them in RoBERTa's Table 2; "
        "the seeds do not give the other rows (DAE + Transformer-XL, - memory, - span-based pred, "
        "- bidirectional data) and the paper was not read for this card, so they have no figure",
        compute="equal FLOPs",
        rows=rows,
        setup=Setup(
            model="BERT-Base's shape, 12 × 768, post-LN; XLNet-Base with Transformer-XL's relative "
            "attention and a memory of 384 states",
            data="BooksCorpus and English Wikipedia, the same for every row",
            steps="BERT-Base's budget (1 M steps of 256 × 512, as the paper says it matches; not checked "
            "for this card)",
            tokenizer="SentencePiece 32k (XLNet) and WordPiece 30k (BERT)",
            evaluation="dev sets: RACE, SQuAD 1.1 and 2.0, MNLI, SST-2",
        ),
        differences=(
            "every row reads Transformer-XL's ordered batches (pretrain.sampling: stream), the ★ too; "
            "XLNet's segments are a continued half and a sentence pair, ours one continued segment",
            "the profile's encoder (its norm position) for every row; XLNet and BERT are post-LN, and only "
            "a post-LN XLNet exports as transformers' XLNetLMHeadModel (a pre-LN one as remote code)",
            "one factorisation order over the whole segment; XLNet's code permutes its reused half and its "
            "pair apart, the first never seeing the second",
            "a memory of one segment (mem_len = seq_len), of every state of the previous segment; XLNet "
            "keeps the reused half's 384 of 512",
            "no relative segment encodings and no [SEP]/[CLS] in the pretraining rows (XLNet's pairs "
            "have both); fine-tuning pools as the profile's encoder does, not on XLNet's last token",
            "the DAE row is our masked LM (80/10/10) on the Transformer-XL encoder with its memory",
            "a reversed row's spans are drawn on its text as written, then reversed with it; XLNet's "
            "`_sample_mask` draws them on the reversed text, where its word-start test finds word ends",
        ),
    ),
)
