"""Dai & Le's LSTM language model: the LSTM stack (models/specs/architectures/lstm.py) in place of the
transformer decoder, reading a pair as GPT's decoder does (models/architectures/decoder.py)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.architectures.base import implemented
from models.architectures.decoder import Decoder, last_state
from models.architectures.encoder import pooled_states
from models.config import ModelConfig
from models.specs.architectures.lstm import LSTMSpec


class LSTMStack(nn.Module):
    """LSTM layers over a sequence, left to right (or right to left: ELMo's backward LM): d_ff cells a
    layer, projected to d_model where wider (LSTMP), dropout between layers, a residual connection
    from the second layer on. Right padding never reaches a real position reading left to right."""

    def __init__(self, cfg: ModelConfig, reverse: bool = False) -> None:
        super().__init__()
        self.reverse = reverse
        projection = cfg.d_model if cfg.d_ff != cfg.d_model else 0
        self.layers = nn.ModuleList(
            nn.LSTM(cfg.d_model, cfg.d_ff, batch_first=True, proj_size=projection)
            for _ in range(cfg.n_layers)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def layer_states(self, x: Tensor, pad_mask: Tensor | None = None) -> list[Tensor]:
        """Each layer's output states, [B, T, d] each. Reading right to left, each row is reversed
        within its real tokens, so that padding stays after them."""
        if self.reverse:
            x = reverse_rows(x, pad_mask)
        states = []
        for i, layer in enumerate(self.layers):
            y = run_layer(layer, self.drop(x) if i else x)  # the embeddings come dropped out
            x = y + x if i else y
            states.append(reverse_rows(x, pad_mask) if self.reverse else x)
        return states

    def forward(self, x: Tensor, pad_mask: Tensor | None, rope: object = None, *context: object) -> Tensor:
        return self.layer_states(x, pad_mask)[-1]


def run_layer(layer: nn.LSTM, x: Tensor) -> Tensor:
    """One LSTM layer's outputs. On the CPU in fp32 under any autocast: PyTorch's CPU LSTM with a
    projection runs 2.4x slower in bf16 than in fp32 (1,024 cells to 256, one thread, measured)."""
    if x.device.type != "cpu":
        return layer(x)[0]
    with torch.autocast("cpu", enabled=False):
        return layer(x.float())[0]


def reverse_rows(x: Tensor, pad_mask: Tensor | None) -> Tensor:
    """Each row's real positions in reverse order, the padding after them where it was."""
    if pad_mask is None:
        return x.flip(1)
    length = pad_mask.long().sum(1, keepdim=True)
    column = torch.arange(x.shape[1], device=x.device)[None]
    source = torch.where(column < length, length - 1 - column, column)
    return x.gather(1, source[..., None].expand_as(x))


class LSTM(LSTMSpec, Decoder):
    def stacks(self, cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
        return None, LSTMStack(cfg)

    def pool(self, states: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        return last_state(states, pad_mask) if pooling == "last" else pooled_states(states, pad_mask, pooling)


ARCHITECTURE = implemented(LSTM())
