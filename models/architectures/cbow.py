"""word2vec's CBOW: the window mean (models/specs/architectures/cbow.py) in place of a transformer
encoder; batches and poolings as BERT's encoder's (models/architectures/encoder.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.architectures.base import implemented
from models.architectures.encoder import Encoder
from models.config import ModelConfig
from models.specs.architectures.cbow import CBOWSpec


class WindowMean(nn.Module):
    """Each position's state: the mean of the real tokens' vectors within `window` of it, its own left
    out (word2vec's CBOW hidden layer), by differences of cumulative sums."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.window = cfg.window

    def forward(self, x: Tensor, pad_mask: Tensor | None, rope: object = None, *context: object) -> Tensor:
        length = x.shape[1]
        real = x.new_ones(x.shape[0], length, 1) if pad_mask is None else pad_mask[..., None].to(x.dtype)
        position = torch.arange(length, device=x.device)
        upper = (position + self.window + 1).clamp(max=length)
        lower = (position - self.window).clamp(min=0)

        def window_sum(values: Tensor) -> Tensor:
            running = F.pad(values.float().cumsum(1), (0, 0, 1, 0))
            return running[:, upper] - running[:, lower]

        x = x * real
        total = window_sum(x) - x.float()
        count = window_sum(real) - real.float()
        return (total / count.clamp(min=1)).to(x.dtype)


class CBOW(CBOWSpec, Encoder):
    def stacks(self, cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
        return WindowMean(cfg), None


ARCHITECTURE = implemented(CBOW())
