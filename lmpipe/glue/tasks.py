"""The one registry of the nine GLUE tasks: what the params check names against, so no pandas here
(lmpipe/glue/prepare.py reads the task files).

Labels follow the Hugging Face `nyu-mll/glue` convention (ids in the order of `labels`), so a task
read from the TSV files, from the Hub or from a `save_to_disk` folder gives the same tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmpipe.runtime import StageError


@dataclass(frozen=True)
class GlueTask:
    name: str  # our key and the Hub config name: "cola", "sst2", ...
    folder: str  # the folder of download_glue_data.py: "CoLA", "SST-2", ...
    text_columns: tuple[str, ...]  # the Hub's column names: one sentence or a pair
    labels: tuple[str, ...] | None  # class names by id; None for regression (STS-B)
    metrics: tuple[str, ...]
    # our split name -> TSV file; MNLI's two validation sets are two evaluations
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train.tsv", "validation": "dev.tsv"})
    header: bool = True
    # TSV column (by header name, or by position when there is no header) of each text and of the label
    tsv_text: tuple[str | int, ...] = ()
    tsv_label: str | int = "label"

    @property
    def title(self) -> str:
        """The GLUE paper's name of the task ("SST-2"), which is also its folder's."""
        return self.folder

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def eval_splits(self) -> list[str]:
        return [s for s in self.splits if s != "train"]


TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in [
        GlueTask(
            "cola",
            "CoLA",
            ("sentence",),
            ("unacceptable", "acceptable"),
            ("matthews_correlation",),
            header=False,
            tsv_text=(3,),
            tsv_label=1,
        ),
        GlueTask(
            "sst2", "SST-2", ("sentence",), ("negative", "positive"), ("accuracy",), tsv_text=("sentence",)
        ),
        GlueTask(
            "mrpc",
            "MRPC",
            ("sentence1", "sentence2"),
            ("not_equivalent", "equivalent"),
            ("f1", "accuracy"),
            tsv_text=("#1 String", "#2 String"),
            tsv_label="Quality",
        ),
        GlueTask(
            "stsb",
            "STS-B",
            ("sentence1", "sentence2"),
            None,
            ("pearson", "spearmanr"),
            tsv_text=("sentence1", "sentence2"),
            tsv_label="score",
        ),
        GlueTask(
            "qqp",
            "QQP",
            ("question1", "question2"),
            ("not_duplicate", "duplicate"),
            ("f1", "accuracy"),
            tsv_text=("question1", "question2"),
            tsv_label="is_duplicate",
        ),
        GlueTask(
            "mnli",
            "MNLI",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            splits={
                "train": "train.tsv",
                "validation_matched": "dev_matched.tsv",
                "validation_mismatched": "dev_mismatched.tsv",
            },
            tsv_text=("sentence1", "sentence2"),
            tsv_label="gold_label",
        ),
        GlueTask(
            "qnli",
            "QNLI",
            ("question", "sentence"),
            ("entailment", "not_entailment"),
            ("accuracy",),
            tsv_text=("question", "sentence"),
        ),
        GlueTask(
            "rte",
            "RTE",
            ("sentence1", "sentence2"),
            ("entailment", "not_entailment"),
            ("accuracy",),
            tsv_text=("sentence1", "sentence2"),
        ),
        GlueTask(
            "wnli",
            "WNLI",
            ("sentence1", "sentence2"),
            ("not_entailment", "entailment"),
            ("accuracy",),
            tsv_text=("sentence1", "sentence2"),
        ),
    ]
}


def task(name: str, key: str) -> GlueTask:
    if name not in TASKS:
        raise StageError(f"{key}: unknown GLUE task '{name}'; the tasks are: {', '.join(TASKS)}")
    return TASKS[name]
