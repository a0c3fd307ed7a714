"""BART (Lewis et al., 2020): its noise functions, Table 1's BART rows, on an encoder-decoder made from
`encdec_span` at the profile's size."""

from __future__ import annotations

from flows.presets import Card, Row, Setup, made_from

NOISE = "objectives.bart.noise"


PERMUTE = "objectives.bart.permute_sentences"


def noise(kind: str, permute: float = 0.0) -> dict:
    return {**made_from("encdec_span", "bart", objective="bart"), NOISE: kind, PERMUTE: permute}


CARDS = (
    Card(
        preset="bart_noise",
        paper="BART (Lewis et al., 2020)",
        table="Table 1 (its BART rows: the noise functions)",
        compares="token masking, token deletion, text infilling (Poisson(3) spans, one [MASK] each), "
        "document rotation and sentence shuffling, 30 % noise, and text infilling with sentence shuffling "
        "(BART's own models' noise)",
        metric="MNLI dev accuracy (Table 1's one GLUE task)",
        figures_from="the paper's Table 1 (it also reports SQuAD, ELI5, XSum, ConvAI2 and CNN/DM)",
        compute="equal steps",
        rows=(
            Row("Token Masking", noise("token_masking"), 84.1),
            Row("Token Deletion", noise("token_deletion"), 84.1),
            Row("Text Infilling", noise("text_infilling"), 84.0, star=True),
            Row("Document Rotation", noise("document_rotation"), 75.3),
            Row("Sentence Shuffling", noise("none", 1.0), 81.5),
            Row("Text Infilling + Sentence Shuffling", noise("text_infilling", 1.0), 83.8),
        ),
        setup=Setup(
            model="BART-Base's shape: 6 encoder and 6 decoder layers × 768, post-LN",
            data="BooksCorpus and Wikipedia (BERT's)",
            steps="the same budget for every Table 1 row (its size not checked for this card)",
            tokenizer="GPT-2's byte-level BPE, 50k",
            evaluation="MNLI dev, fine-tuned",
        ),
        differences=(
            "Table 1's other objectives (its language model, permuted LM, masked LM, multitask and masked "
            "seq2seq rows, each BART's reimplementation) are other presets' rows here, not this card's",
            "sentences end at a full stop, question or exclamation mark or a document's end (fairseq: "
            "GPT-2's full-stop token), and a row is a 128-token window of the packed stream, so its first "
            "and last sentences are cut (fairseq's blocks hold up to 512 tokens of one document)",
            "Table 1 has no ★ row: text infilling, the noise BART found most consistently strong, is ours",
        ),
    ),
)
