"""What a student's run adds to a pretraining (stage `distill@<student>`): its teacher's weights, read
from the teacher's checkpoint and checked against params.yaml, and DistilBERT's module and loss
(models/distillation.py). lmpipe/pretraining.py runs it as it runs any model's pretraining."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmpipe.layout import WEIGHTS, final_checkpoint
from lmpipe.params.distill import StudentParams, student_layers
from lmpipe.pretraining import Prepared
from lmpipe.runtime import StageError, read_json, sha256_file


@dataclass
class Student:
    """A student's distillation: its teacher (a model of `models`), the teacher's weights and their
    digest, and the distillation's config."""

    teacher: str
    config: Any  # models.distillation.DistillConfig
    teacher_state: dict[str, Any]
    teacher_sha256: str
    plan: Prepared

    def module(self, model_cfg: Any, train_cfg: Any, compile: bool) -> Any:
        """The student's Lightning module, the teacher beside it, the student initialised from it."""
        from models.distillation import DistillModule

        module = DistillModule(model_cfg, train_cfg, self.config, compile=compile)
        module.init_from(self.teacher_state)
        return module

    def shaping(self) -> list[Any]:
        """What the resume fingerprint adds: the distillation's settings and the teacher's weights."""
        from models.distillation import describe

        return [describe(self.config), self.teacher_sha256]

    def tags(self) -> dict[str, str]:
        return {"teacher": self.teacher, "teacher_sha256": self.teacher_sha256}

    def logged(self) -> dict[str, Any]:
        from models.distillation import describe

        return describe(self.config) | {"teacher_model": self.teacher}

    def summary(self, steps: int) -> dict[str, Any]:
        """What the student's metrics add: its teacher, the layers it was copied from, and the FLOPs a
        distillation step spends in all (the teacher's forward pass and the soft targets' LM heads
        beside the student's own forward and backward, its `flops_per_step`)."""
        from models.distillation import count_distill_step_flops

        budget = self.plan.budget
        step = (
            count_distill_step_flops(budget.model_cfg, budget.train_cfg, self.config) * budget.micro_batches
        )
        return {
            "teacher": self.teacher,
            "teacher_layers": list(self.config.layers),
            "distill_flops_per_step": step,
            "distill_flops": steps * step,
        }


def student_run(student: StudentParams, plan: Prepared) -> Student:
    """A student's run (what `lmpipe.pretraining.pretrain` calls with its plan): its teacher from its
    checkpoint, which must have been pretrained on this tokenizer and be the model params.yaml names
    (the student's shape is derived from that)."""
    from safetensors.torch import load_file

    from models.config import ModelConfig
    from models.distillation import DistillConfig

    folder = final_checkpoint(student.teacher)
    config = read_json(folder / "config.json", f"pretrain@{student.teacher}")
    if config.get("tokenizer_sha256") != plan.meta["tokenizer_sha256"]:
        raise StageError(
            f"{folder}: the teacher was pretrained with tokenizer {str(config.get('tokenizer_sha256'))[:12]},"
            f" but data/tokens are {plan.meta['tokenizer_sha256'][:12]}; re-run pretrain@{student.teacher}"
        )
    teacher = ModelConfig(**config["model"])
    layers = tuple(student_layers(student, teacher.n_layers))
    if teacher.with_(n_layers=len(layers)) != plan.budget.model_cfg:
        raise StageError(
            f"{folder}: not models.{student.teacher} as params.yaml has it; re-run pretrain@{student.teacher}"
        )
    distill = DistillConfig(
        teacher,
        layers,
        student.init,
        student.temperature,
        *student.weights(),
        restrict_ce_to_mask=student.restrict_ce_to_mask,
    )
    weights = folder / WEIGHTS
    return Student(student.teacher, distill, load_file(str(weights)), sha256_file(weights), plan)
