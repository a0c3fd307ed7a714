"""What the pretraining and the fine-tuning loops share: seeded streams and reading the losses."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


class NonFiniteLoss(FloatingPointError):
    """The loss of a training step (pretraining or fine-tuning) became NaN or infinite."""

    def __init__(self, step: int, value: float) -> None:
        super().__init__(f"the loss became {value} at step {step}")
        self.step, self.value = step, value


def read_losses(losses: list[Tensor], steps: Sequence[int]) -> list[float]:
    """The losses of `steps`, still on the device, read in one transfer (a training loop reads them
    every so many steps, never one per step); the first that is not finite raises NonFiniteLoss."""
    if not losses:
        return []
    values = torch.stack(losses).float().cpu()
    finite = torch.isfinite(values)
    if not finite.all():
        first = int((~finite).nonzero()[0])
        raise NonFiniteLoss(steps[first], float(values[first]))
    return values.tolist()


def resolve_precision(precision: str, device: torch.device) -> str:
    """params.yaml's `precision` for a run on `device`: `auto` is bf16-mixed where bf16 is native (a
    CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX) and 32-true elsewhere. PyTorch emulates
    bf16 on other CPUs: 30x slower than fp32 on a 2-core EPYC without AVX-512 (docs/results/2026-11.md)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:  # the checks oneDNN makes; PyTorch has no public name for them
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return "bf16-mixed" if native else "32-true"


def derived_seed(*keys: int) -> int:
    """A 63-bit seed that is a pure function of `keys`; different keys give independent streams."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1, dtype=np.uint64)[0] >> 1)
