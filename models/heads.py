"""Sequence classification and regression heads for fine-tuning, on one state per sequence: the
architecture's pooling (models/architectures: each says which it allows, the first its default)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from models.transformer import Transformer


class SequenceHead(nn.Module):
    """A pretrained (or freshly initialised) backbone and a linear head on its pooled state; `frozen`:
    the backbone's weights fixed (ELMo's features), but for the ones its architecture leaves to a task."""

    def __init__(
        self,
        backbone: Transformer,
        num_labels: int,
        pooling: str | None = None,
        dropout: float = 0.1,
        lm_loss_weight: float = 0.0,
        frozen: bool = False,
    ) -> None:
        super().__init__()
        arch = backbone.arch
        self.pooling = pooling or arch.poolings[0]
        if self.pooling not in arch.poolings:
            raise ValueError(
                f"pooling '{self.pooling}' does not fit arch '{arch.name}' (use {' or '.join(arch.poolings)})"
            )
        if lm_loss_weight and not arch.finetune_lm_loss:
            raise ValueError(f"arch '{arch.name}' has no causal LM over its fine-tuning input")
        self.lm_loss_weight = lm_loss_weight  # GPT-1's auxiliary LM loss: its weight beside the task's
        self.backbone = backbone
        self.num_labels = num_labels  # 1 = regression
        self.drop = nn.Dropout(dropout)
        if frozen:  # ELMo's features: the backbone fixed but for the weights a task trains (its mix)
            task = {id(p) for p in arch.task_parameters(backbone)}
            for parameter in backbone.parameters():
                parameter.requires_grad_(id(parameter) in task)
        self.out = nn.Linear(arch.pooled_size(backbone.cfg), num_labels)
        nn.init.normal_(self.out.weight, std=backbone.cfg.init_std)
        nn.init.zeros_(self.out.bias)

    def pooled(self, ids: Tensor, pad_mask: Tensor) -> Tensor:
        """[B, d]: one state per sequence. `pad_mask` is True on real tokens (right padding)."""
        return self.backbone.arch.pooled(self.backbone, ids, pad_mask, self.pooling)

    def forward(self, ids: Tensor, pad_mask: Tensor) -> Tensor:
        """Logits [B, num_labels], or predictions [B] for regression (never [B, 1])."""
        return self._logits(self.pooled(ids, pad_mask))

    def _logits(self, pooled: Tensor) -> Tensor:
        logits = self.out(self.drop(pooled))
        return logits.squeeze(-1) if self.num_labels == 1 else logits

    def forward_and_lm_loss(self, ids: Tensor, pad_mask: Tensor) -> tuple[Tensor, Tensor | None]:
        """`forward`, and with `lm_loss_weight` the LM loss of the input from the same states."""
        if not self.lm_loss_weight:
            return self(ids, pad_mask), None
        pooled, lm_loss = self.backbone.arch.pooled_and_lm_loss(self.backbone, ids, pad_mask, self.pooling)
        return self._logits(pooled), lm_loss

    def loss(self, output: Tensor, labels: Tensor) -> Tensor:
        if self.num_labels == 1:
            return F.mse_loss(output, labels.to(output.dtype).reshape(output.shape))
        return F.cross_entropy(output, labels.long())
