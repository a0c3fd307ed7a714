"""The seeds' summary of pretrained models (003, "Summary of pretrained models we looked at", with the
steps of its history before it) as one comparison: word2vec's CBOW, Dai & Le's LSTM LM, ELMo (frozen
features and fine-tuned), GPT-1 and BERT, on the same data at equal FLOPs, each with its scratch
baseline."""

from __future__ import annotations

from typing import Any

from flows.presets import MODELS_KEY, Card, Row, Setup, made_from

RECURRENT = {"positions": "none"}  # the order read by the recurrence: no position signal


def elmo(frozen: bool) -> dict[str, Any]:
    return {
        **made_from("decoder_clm", "elmo_bilm", arch="elmo", n_layers=2, **RECURRENT),  # ELMo's two
        "finetune.method": "frozen" if frozen else "full",
    }


CARDS = (
    Card(
        preset="lineage",
        paper="From word2vec to BERT (Mikolov et al., 2013; Dai & Le, 2015; Peters et al., 2018; Radford et "
        "al., 2018; Devlin et al., 2018)",
        table="the seeds' summary table of pretrained models (model, data, objective) and the history "
        "before it (003)",
        compares="word2vec's CBOW (a feed-forward model of a word from its window), Dai & Le's LSTM LM "
        "fine-tuned, ELMo's biLM as frozen features through its scalar mix and fine-tuned, GPT-1's "
        "transformer LM and BERT's masked LM, pretrained on the same text at equal FLOPs and each "
        "fine-tuned beside the same model from scratch",
        metric="GLUE dev average (the report's, with each row's pretrained − scratch verdict)",
        figures_from="no row has a figure: the seeds' summary table gives each system's model, data and "
        "objective, no scores, and the papers evaluate on different tasks (word2vec: word analogies; "
        "Dai & Le: IMDB and others; ELMo: SQuAD, SNLI and four more; GPT-1 and BERT: GLUE)",
        compute="equal FLOPs",
        rows=(
            Row(
                "W2V CBOW [Mikolov et al., 2013]",
                made_from(
                    "encoder_mlm", "cbow_w2v", arch="cbow", objective="cbow", lm_head="untied", **RECURRENT
                ),
            ),
            Row(
                "LSTM LM, fine-tuned [Dai & Le, 2015]",
                made_from("decoder_clm", "lstm_lm", arch="lstm", n_layers=1, **RECURRENT),  # Dai & Le's one
            ),
            Row("ELMo, frozen features [Peters et al., 2018]", elmo(frozen=True)),
            Row("ELMo, fine-tuned", elmo(frozen=False)),
            Row("GPT-1 [Radford et al., 2018]", {MODELS_KEY: "decoder_clm"}),
            Row("BERT [Devlin et al., 2018]", {MODELS_KEY: "encoder_mlm"}, star=True),
        ),
        setup=Setup(
            model="word2vec: 300-dimensional vectors; Dai & Le: one LSTM layer of 1,024 cells; ELMo: two "
            "LSTM layers of 4,096 cells projected to 512 with a character CNN; GPT-1: 12 × 768; BERT-Base: "
            "12 × 768",
            data="Google News (100 B words), 1B Word benchmark (800 M words), BooksCorpus, BooksCorpus + "
            "English Wikipedia (3.3 B words): each its own",
            steps="each paper's own budget",
            tokenizer="words (word2vec, Dai & Le), characters (ELMo), BPE (GPT-1), WordPiece (BERT)",
            evaluation="each paper's own tasks; GLUE only for GPT-1 and BERT",
        ),
        differences=(
            "every row on the same text, tokenizer and FLOPs, at the profile's width: the LSTMs have "
            "d_ff cells a layer projected to d_model (ELMo's LSTMP), one layer (Dai & Le's) and two a "
            "direction (ELMo's), and no character CNN (ELMo) or word vocabulary (word2vec, Dai & Le)",
            "CBOW predicts every token from the mean of its window (5 each side) with a full softmax over "
            "its own output vectors, not word2vec's negative sampling or hierarchical softmax",
            "the task model is the same linear head for every row, on the row's pooling (CBOW and ELMo: "
            "the mean of the states; the LSTM and GPT-1: the last token; BERT: [CLS]); ELMo's papers "
            "put its features into task-specific biLSTM models",
            "ELMo's frozen row trains only the head and the scalar mix (finetune.method: frozen), "
            "and so does its scratch baseline: random frozen LSTMs",
            "the profile's GPT-1 and BERT rows (pre-LN, no next-sentence prediction) as the other presets "
            "have them",
        ),
    ),
)
