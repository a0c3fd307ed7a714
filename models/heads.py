"""Sequence classification and regression heads for fine-tuning, one pooling per architecture.

Encoder: the [CLS] state (position 0), or the masked mean of its states (our MLM pretraining never
shows [CLS], so its state starts untrained; the mean pools states the pretraining did train).
Decoder: the last non-pad token, the only one that has seen the whole input. Encoder-decoder: the
masked mean of the encoder states, or the first decoder state (the decoder run on one start token,
attending to the whole encoder).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.transformer import Transformer

Pooling = Literal["cls", "mean", "last", "mean_encoder", "first_decoder"]
DEFAULT_POOLING: dict[str, Pooling] = {"encoder": "cls", "decoder": "last", "encoder_decoder": "mean_encoder"}


class SequenceHead(nn.Module):
    """A pretrained (or freshly initialised) backbone and a linear head on its pooled state."""

    def __init__(
        self,
        backbone: Transformer,
        num_labels: int,
        pooling: Pooling | None = None,
        dropout: float = 0.1,
        start_id: int = 2,
    ) -> None:
        super().__init__()
        arch = backbone.cfg.arch
        self.pooling = pooling or DEFAULT_POOLING[arch]
        allowed = {
            "encoder": ("cls", "mean"),
            "decoder": ("last",),
            "encoder_decoder": ("mean_encoder", "first_decoder"),
        }
        if self.pooling not in allowed[arch]:
            raise ValueError(
                f"pooling '{self.pooling}' does not fit arch '{arch}' (use {' or '.join(allowed[arch])})"
            )
        self.backbone = backbone
        self.num_labels = num_labels  # 1 = regression
        self.start_id = start_id
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(backbone.cfg.d_model, num_labels)
        nn.init.normal_(self.out.weight, std=backbone.cfg.init_std)
        nn.init.zeros_(self.out.bias)

    def pooled(self, ids: Tensor, pad_mask: Tensor) -> Tensor:
        """[B, d]: one state per sequence. `pad_mask` is True on real tokens (right padding)."""
        net = self.backbone
        if self.pooling == "cls":
            return net.encode(ids, pad_mask)[:, 0]
        if self.pooling == "last":
            hidden = net.decode(ids, pad_mask)
            last = pad_mask.long().sum(1) - 1
            return hidden[torch.arange(len(ids), device=ids.device), last]
        memory = net.encode(ids, pad_mask)
        if self.pooling in ("mean", "mean_encoder"):
            weights = pad_mask.unsqueeze(-1).to(memory.dtype)
            return (memory * weights).sum(1) / weights.sum(1).clamp(min=1)
        start = torch.full((len(ids), 1), self.start_id, dtype=ids.dtype, device=ids.device)
        return net.decode(start, None, memory, pad_mask)[:, 0]

    def forward(self, ids: Tensor, pad_mask: Tensor) -> Tensor:
        """Logits [B, num_labels], or predictions [B] for regression (never [B, 1])."""
        logits = self.out(self.drop(self.pooled(ids, pad_mask)))
        return logits.squeeze(-1) if self.num_labels == 1 else logits

    def loss(self, output: Tensor, labels: Tensor) -> Tensor:
        if self.num_labels == 1:
            return F.mse_loss(output, labels.to(output.dtype).reshape(output.shape))
        return F.cross_entropy(output, labels.long())
