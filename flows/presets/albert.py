"""ALBERT (Lan et al., 2020): its parameter reductions against BERT (Tables 2-4) and its inter-sentence
losses (Table 5), every row an encoder made from `encoder_mlm` at the profile's size, on segment pairs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, model_fields, on_segment_pairs

PAPER = "ALBERT (Lan et al., 2020)"
SETUP = Setup(
    model="BERT-Base's and ALBERT-base's shape: 12 × 768, E 128 for ALBERT",
    data="BooksCorpus and Wikipedia, 16 GB",
    steps="125,000 steps of 4,096 × 512, LAMB at lr 0.00176",
    tokenizer="SentencePiece, 30k pieces",
    evaluation="SQuAD 1.1, SQuAD 2.0, MNLI, SST-2 and RACE dev, their average",
)


def pairs(params: Mapping[str, Any], name: str, pair_loss: str, **fields: Any) -> dict[str, Any]:
    """An encoder made from `encoder_mlm` in BERT's and ALBERT's form (post-LN, their prediction head:
    AlbertForPreTraining's computation, tests/test_reference.py), on segment pairs with segment
    embeddings, trained with `pair_loss` beside the masked LM (ALBERT's data are segment pairs
    whatever the loss)."""
    form = {"norm_position": "post", "lm_head": "transform"}
    model = on_segment_pairs(params, "encoder_mlm", **form, **fields)
    return {MODELS_KEY: {name: model}, "pack.sentences": True, "objectives.mlm.pair_loss": pair_loss}


def reductions(params: Mapping[str, Any]) -> list[Row]:
    """BERT against ALBERT's two parameter reductions, alone and together: the embeddings factorized at
    BERT-base's ratio E/H = 128/768 (rounded to a multiple of 8), and every layer one shared block;
    every row with sentence-order prediction, as ALBERT's code makes the data of every model it trains."""
    d_model = model_fields(params, "encoder_mlm", "albert")["d_model"]
    factorized = {"embedding_size": max(8, round(d_model * 128 / 768 / 8) * 8)}
    shared = {"share_layers": "all"}
    return [
        Row("BERT-base (not shared, E = H)", pairs(params, "encoder_bert", "sop"), 82.3, star=True),
        Row("not shared, E 128", pairs(params, "encoder_factorized", "sop", **factorized), 81.7),
        Row("all-shared, E = H", pairs(params, "encoder_shared", "sop", **shared), 79.8),
        Row(
            "ALBERT-base (all-shared, E 128)",
            pairs(params, "encoder_albert", "sop", **factorized, **shared),
            80.1,
        ),
    ]


def sentence_losses(params: Mapping[str, Any]) -> list[Row]:
    """ALBERT-base (factorized, all shared) trained with no inter-sentence loss, BERT's next-sentence
    prediction and ALBERT's sentence-order prediction."""
    d_model = model_fields(params, "encoder_mlm", "albert_sentence_loss")["d_model"]
    albert = {"embedding_size": max(8, round(d_model * 128 / 768 / 8) * 8), "share_layers": "all"}
    return [
        Row("None", pairs(params, "albert_none", "none", **albert), 79.0),
        Row("NSP", pairs(params, "albert_nsp", "nsp", **albert), 79.2),
        Row("SOP", pairs(params, "albert_sop", "sop", **albert), 80.1, star=True),
    ]


CARDS = (
    Card(
        preset="albert",
        paper=PAPER,
        table="Tables 2-4 (factorized embeddings, cross-layer sharing, both: ALBERT-base)",
        compares="BERT's encoder against its embeddings factorized (E 128 of 768), its layers one shared "
        "block, and both (ALBERT)",
        metric="the average of SQuAD 1.1, SQuAD 2.0, MNLI, SST-2 and RACE",
        figures_from="the paper: BERT-base 82.3 and ALBERT-base 80.1 (Table 2, the seeds' ALBERT notes); "
        "not shared at E 128, 81.7 (Table 3); all-shared at E 768, 79.8 (Table 4)",
        compute="equal FLOPs",
        rows=reductions,
        setup=SETUP,
        differences=(
            "E is BERT-base's ratio 128/768 of the profile's width (24 at tiny, 40 at small)",
            "equal FLOPs: sharing costs what unshared layers do; the factorized LM head a little less, so "
            "a few more steps. ALBERT trained every row for the same steps",
            "each row's parameters are in the comparison (at bert-base with E 128: 108.9, 89.1, 30.9 and "
            "11.2 M, ALBERT's 108, 89, 31 and 12 M)",
        ),
    ),
    Card(
        preset="albert_sentence_loss",
        paper=PAPER,
        table="Table 5 (inter-sentence loss)",
        compares="ALBERT-base with no inter-sentence loss (XLNet's and RoBERTa's), BERT's next-sentence "
        "prediction, and its sentence-order prediction",
        metric="the average of SQuAD 1.1, SQuAD 2.0, MNLI, SST-2 and RACE",
        figures_from="the paper's Table 5 (it also reports each row's MLM, NSP and SOP accuracy)",
        compute="equal steps",
        rows=sentence_losses,
        setup=SETUP,
        differences=("every row reads segment pairs; with no loss, the pairs are read and not classified",),
    ),
)
