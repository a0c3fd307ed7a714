"""DistilBERT's distillation (Sanh et al., 2019; huggingface/transformers' research_projects/distillation):
a student of the teacher's width and half its layers, initialised from every other layer of the
teacher, trained on the teacher's outputs beside its own objective. Its loss, as that code has it:

    alpha_ce · T² · KL(softmax(t / T) ‖ softmax(s / T))   over every real token (or the predicted ones)
  + alpha_mlm · the objective's cross-entropy on the true tokens
  + alpha_cos · (1 − cos(h_s, h_t))                     the last hidden states, over every real token
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from models.config import ModelConfig
from models.objectives.base import Terms
from models.pretraining import PretrainModule, TrainConfig
from models.transformer import Transformer

_BLOCK = re.compile(r"^((?:encoder|decoder)\.blocks\.)(\d+)(\..*)$")


@dataclass(frozen=True)
class DistillConfig:
    """What shapes a distillation beyond the student's pretraining config."""

    teacher: ModelConfig
    layers: tuple[int, ...]  # the teacher's layers the student's were copied from
    init: str  # teacher | random
    temperature: float
    alpha_ce: float
    alpha_mlm: float
    alpha_cos: float
    restrict_ce_to_mask: bool = False  # DistilBERT's flag: the soft targets at the predicted tokens only


def student_state(
    teacher: dict[str, Tensor], student: Transformer, layers: tuple[int, ...]
) -> dict[str, Tensor]:
    """The student's weights from the teacher's state: its block i is the teacher's block layers[i]; the
    embeddings, norms and LM head are the teacher's (extract_distilbert.py's mapping)."""
    state = {}
    for key in student.state_dict():
        match = _BLOCK.match(key)
        source = f"{match[1]}{layers[int(match[2])]}{match[3]}" if match else key
        state[key] = teacher[source].clone()
    return state


def distillation_losses(
    student_logits: Tensor,
    teacher_logits: Tensor,
    student_states: Tensor,
    teacher_states: Tensor,
    temperature: float,
) -> tuple[Tensor, Tensor]:
    """(the soft targets' loss, the cosine loss): the KL divergence of the student's tempered
    distribution from the teacher's, a token's mean, × T² (so that its gradients keep their scale as T
    changes, Hinton et al.); 1 − the cosine of the two last hidden states, a token's mean."""
    log_student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    soft_targets = F.softmax(teacher_logits.float() / temperature, dim=-1)
    ce = F.kl_div(log_student, soft_targets, reduction="batchmean") * temperature**2
    cosine = 1 - F.cosine_similarity(student_states.float(), teacher_states.float(), dim=-1).mean()
    return ce, cosine


class DistillModule(PretrainModule):
    """A student's pretraining module: the frozen teacher beside it, the step's terms DistilBERT's."""

    def __init__(
        self, model: ModelConfig, train: TrainConfig, distill: DistillConfig, compile: bool = False
    ) -> None:
        super().__init__(model, train, compile)
        self.distill = distill
        self.teacher = Transformer(distill.teacher).requires_grad_(False).eval()

    def init_from(self, teacher_state: dict[str, Tensor]) -> None:
        """The teacher's weights, and the student's copied from them unless its init is random."""
        self.teacher.load_state_dict(teacher_state)
        if self.distill.init == "teacher":
            self.model.load_state_dict(student_state(teacher_state, self.model, self.distill.layers))

    def train(self, mode: bool = True) -> DistillModule:
        super().train(mode)
        self.teacher.eval()  # the teacher's dropout stays off: its outputs are the targets
        return self

    def terms(self, batch: dict[str, Tensor]) -> Terms:
        ids, pad_mask, prefix = batch["input_ids"], batch.get("pad_mask"), batch.get("prefix_lengths")
        student = self.model(ids, pad_mask, prefix_lengths=prefix)
        with torch.no_grad():
            teacher = self.teacher(ids, pad_mask, prefix_lengths=prefix)
        logits, labels = self.model.arch.logits_and_labels(self.model, batch, student)
        loss, correct = self._token_loss(logits, labels)
        if pad_mask is None:  # every position a real token
            student_states, teacher_states = student.flatten(0, 1), teacher.flatten(0, 1)
        else:
            student_states, teacher_states = student[pad_mask], teacher[pad_mask]
        if self.distill.restrict_ce_to_mask:
            with torch.no_grad():
                teacher_logits, _ = self.teacher.arch.logits_and_labels(self.teacher, batch, teacher)
            student_logits = logits
        else:
            with torch.no_grad():
                teacher_logits = self.teacher.lm_logits(teacher_states)
            student_logits = self.model.lm_logits(student_states)
        ce, cosine = distillation_losses(
            student_logits, teacher_logits, student_states, teacher_states, self.distill.temperature
        )
        extra = {"soft_targets": (ce, self.distill.alpha_ce), "cosine": (cosine, self.distill.alpha_cos)}
        return Terms(loss, correct, labels.numel(), extra, weight=self.distill.alpha_mlm)


def count_distill_step_flops(model: ModelConfig, train: TrainConfig, distill: DistillConfig) -> int:
    """FLOPs of one micro-batch of distillation, as FlopCounterMode counts them on the meta device: the
    student's forward and backward, the teacher's forward, the soft targets' LM heads."""
    from models.flops import module_step_flops

    with torch.device("meta"):
        module = DistillModule(model, train, distill)
    return module_step_flops(module, train)


def describe(distill: DistillConfig) -> dict[str, Any]:
    """The distillation's settings as plain values (the resume fingerprint, MLflow)."""
    return {
        "teacher": distill.teacher.to_dict(),
        "layers": list(distill.layers),
        "init": distill.init,
        "temperature": distill.temperature,
        "alpha_ce": distill.alpha_ce,
        "alpha_mlm": distill.alpha_mlm,
        "alpha_cos": distill.alpha_cos,
        "restrict_ce_to_mask": distill.restrict_ce_to_mask,
    }
