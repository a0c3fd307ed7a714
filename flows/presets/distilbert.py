"""DistilBERT (the seeds' 003, "Going toward smaller powerful LMs"): a student of half the teacher's
layers, initialised from every other one of them and trained on the teacher's outputs, against the
teacher and against the same student pretrained from scratch for the same steps (the same student
FLOPs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.presets import MODELS_KEY, STUDENTS_KEY, Card, Row, Setup, model_fields

TEACHER = "encoder_mlm"


def student(params: Mapping[str, Any], **options: Any) -> dict[str, Any]:
    """A student of the profile's encoder, trained for the teacher's own budget (its `pretrain` values)."""
    own = ((params.get(MODELS_KEY) or {}).get(TEACHER) or {}).get("pretrain") or {}
    entry = {"teacher": TEACHER, "arch": "encoder", "objective": "mlm", "pretrain": dict(own)}
    return entry | options


def distilbert_rows(params: Mapping[str, Any]) -> list[Row]:
    """The teacher, its distilled student ★, the student's shape pretrained from scratch for as many
    steps, and the student initialised at random (the paper's Table 4 row)."""
    half = model_fields(params, TEACHER, "distilbert")["n_layers"] // 2
    with_teacher = {MODELS_KEY: [TEACHER]}
    return [
        Row("BERT-base (the teacher)", with_teacher, 79.5, model=TEACHER),
        Row(
            "DistilBERT",
            with_teacher | {STUDENTS_KEY: {"distilbert": student(params)}},
            77.0,
            star=True,
            model="distilbert",
        ),
        Row(
            "the student's shape pretrained from scratch, as many steps",
            {MODELS_KEY: {"small_bert": {"from": TEACHER, "n_layers": half}}},
            model="small_bert",
        ),
        Row(
            "DistilBERT, random initialisation (Table 4)",
            with_teacher | {STUDENTS_KEY: {"distilbert_random": student(params, init="random")}},
            model="distilbert_random",
        ),
    ]


CARDS = (
    Card(
        preset="distilbert",
        paper="DistilBERT (Sanh et al., 2019)",
        table="Table 1 (GLUE dev) and the random-initialisation row of Table 4",
        compares="BERT-base against DistilBERT, its student of 6 of its 12 layers distilled with the triple "
        "loss (soft targets at T = 2, the masked LM, the cosine of the last hidden states), against the "
        "student's shape pretrained without a teacher and against the student initialised at random",
        metric="GLUE dev macro-score (the report's average over the profile's tasks; the paper's is over "
        "the nine tasks, WNLI included)",
        figures_from="huggingface/transformers' research_projects/distillation README, which gives Table "
        "1's macro-scores (BERT-base-uncased 79.5, DistilBERT-base-uncased 77.0: 97 %); the scratch "
        "student is not a row of the paper, and Table 4's Δ for random initialisation could not be read "
        "here",
        compute="equal steps",
        rows=distilbert_rows,
        setup=Setup(
            model="BERT-base, 12 × 768 (110 M parameters); the student 6 × 768 (66 M)",
            data="BERT's: English Wikipedia and the Toronto Book Corpus",
            steps="the student: about 90 hours on 8 V100s, batches of up to 4K sequences (gradient "
            "accumulation), dynamic masking, no next-sentence prediction",
            tokenizer="BERT's WordPiece, 30k",
            evaluation="GLUE dev, the median of 5 runs",
        ),
        differences=(
            "the teacher is the profile's encoder pretrained by the graph for the profile's steps, not "
            "Google's BERT-base; the student takes every other of its layers, the first and last kept",
            "the student trains the teacher's steps and batch; the paper distilled on large batches",
            "the masked LM draws tokens uniformly; DistilBERT's, after XLM, draws rare tokens more "
            "often (mlm_smoothing 0.7)",
            "the student's position embeddings train; the paper's script froze them (--freeze_pos_embs)",
            "the scratch student is the teacher's model with half its layers, pretrained alone for the "
            "same steps: the same student FLOPs, without the teacher's forward passes (the metrics "
            "give a distillation step's FLOPs, the teacher's included)",
        ),
    ),
)
