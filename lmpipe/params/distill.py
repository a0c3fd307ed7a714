"""The `distill` section: DistilBERT's students, each trained by stage `distill@<student>` from a model of
`models` (its teacher), then fine-tuned, exported and evaluated as a model of its own."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from lmpipe.params.schema import Strict
from models.specs.architectures import ARCHITECTURES


class StudentParams(Strict):
    """A student: its teacher's shape with fewer layers, trained on the teacher's outputs."""

    teacher: str = Field(description="a model of `models`, pretrained by its own stage")
    # DVC reads these two here (the student's stages list its code's digests by them): its teacher's
    arch: str = Field(description="the teacher's architecture (DVC reads it here: its code's digests)")
    objective: str = Field(description="the teacher's objective, the student's own loss (its L_mlm)")
    layers: list[int] | None = Field(
        None,
        min_length=1,
        description="the teacher's layers the student's are copied from, in order; null: DistilBERT's "
        "every other layer, the first and the last kept (12 layers: 0, 2, 4, 7, 9, 11)",
    )
    init: Literal["teacher", "random"] = Field(
        "teacher", description="teacher: its embeddings, LM head and `layers` copied; random: a fresh init"
    )
    temperature: float = Field(2.0, gt=0, description="of both softmaxes in the soft-target loss")
    alpha_ce: float = Field(5.0, ge=0, description="the soft targets' cross-entropy (× temperature²)")
    alpha_mlm: float = Field(2.0, ge=0, description="the objective's own loss on the true tokens")
    alpha_cos: float = Field(1.0, ge=0, description="1 - cosine of the student's and teacher's last states")
    restrict_ce_to_mask: bool = Field(
        False,
        description="the soft targets at the objective's predicted tokens only (DistilBERT: every token)",
    )
    pretrain: dict[str, Any] = Field(
        {}, description="this student's own values of `pretrain` keys (its budget: steps, batch, lr)"
    )

    @field_validator("layers")
    @classmethod
    def _ascending(cls, layers: list[int] | None) -> list[int] | None:
        if layers is not None and (
            layers[0] < 0 or any(b <= a for a, b in zip(layers, layers[1:], strict=False))
        ):
            raise ValueError(f"{layers}: the teacher's layers, distinct, ascending, from 0")
        return layers

    def weights(self) -> tuple[float, float, float]:
        return self.alpha_ce, self.alpha_mlm, self.alpha_cos


class DistillParams(Strict):
    students: dict[str, StudentParams] = {}


def every_other_layer(n_layers: int) -> list[int]:
    """DistilBERT's choice of a teacher's layers (its scripts/extract_distilbert.py, 12 -> 0, 2, 4, 7, 9,
    11): half of them, evenly spread, the first and the last included."""
    count = n_layers // 2
    if count == 1:
        return [0]
    return [round(i * (n_layers - 1) / (count - 1)) for i in range(count)]


def student_entry(name: str, student: StudentParams, teacher: Any, teacher_layers: int) -> dict[str, Any]:
    """The student as an entry of `models`: its teacher's, with its own layers and budget. `teacher` is
    the teacher's entry as written; one line names the key where the two cannot be a teacher and student."""
    key = f"distill.students.{name}"
    for field in ("arch", "objective"):
        if getattr(student, field) != teacher.get(field):
            raise ValueError(
                f"{key}.{field}: {getattr(student, field)!r}, not its teacher's (models.{student.teacher}."
                f"{field}: {teacher.get(field)!r}); a student has its teacher's architecture and objective"
            )
    spec = ARCHITECTURES.get(student.arch)
    if spec is not None and (not spec.transformer_blocks or spec.encoder == spec.decoder):
        raise ValueError(
            f"{key}.teacher: arch {student.arch}; a student takes every other layer of one transformer "
            "stack (encoder, decoder, prefix_lm)"
        )
    for field, allowed in (("share_layers", "none"), ("mem_len", 0)):
        if teacher.get(field, allowed) != allowed:
            raise ValueError(
                f"{key}.teacher: models.{student.teacher}.{field} is {teacher[field]!r}; a student copies "
                f"distinct layers of a teacher without a memory ({field}: {allowed!r})"
            )
    if teacher_layers < 2 and student.layers is None:
        raise ValueError(
            f"{key}.layers: models.{student.teacher} has {teacher_layers} layer: nothing to halve"
        )
    layers = student_layers(student, teacher_layers)
    if layers[-1] >= teacher_layers:
        raise ValueError(f"{key}.layers: {layers}: models.{student.teacher} has {teacher_layers} layers")
    own = {k: v for k, v in teacher.items() if k != "pretrain"}
    return own | {"n_layers": len(layers), "pretrain": student.pretrain}


def student_layers(student: StudentParams, teacher_layers: int) -> list[int]:
    """The teacher's layers the student's are copied from."""
    return every_other_layer(teacher_layers) if student.layers is None else student.layers
