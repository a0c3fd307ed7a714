"""What a pretraining objective is, and the random stream its batches draw from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import Tensor

from models.training import derived_seed
from models.transformer import Transformer

Args = Mapping[str, float]  # params.yaml `objectives.<name>`


class Objective(ABC):
    """A pretraining objective: the tokens a row reads, a batch made of rows, the logits and labels its
    cross-entropy compares, and the batch's shapes (what the FLOPs count needs)."""

    name: ClassVar[str]
    arch: ClassVar[str]  # the architecture it trains (models/config.py OBJECTIVE_OF_ARCH)

    def row_length(self, seq_len: int, args: Args) -> int:
        """Tokens read per row for inputs of `seq_len`."""
        return seq_len

    @abstractmethod
    def batch(
        self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int
    ) -> dict[str, Tensor]: ...

    @abstractmethod
    def logits_and_labels(self, model: Transformer, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Flat logits and the labels they predict."""

    @abstractmethod
    def lengths(self, batch_size: int, seq_len: int, args: Args) -> tuple[int, int, int]:
        """(encoder or decoder-only length, decoder length of an encoder-decoder, predictions per batch)."""

    def example_batch(self, batch_size: int, seq_len: int, args: Args) -> dict[str, Tensor]:
        """A batch of the objective's shapes, on the meta device."""
        t, targets, _ = self.lengths(batch_size, seq_len, args)
        meta = {"dtype": torch.long, "device": "meta"}
        return {
            "input_ids": torch.zeros(batch_size, t, **meta),
            "labels": torch.zeros(batch_size, targets or t, **meta),
        }


def batch_generator(seed: int, index: int) -> torch.Generator:
    """The RNG of one micro-batch by its index across processes (micro-step × processes + rank): the
    same masks whichever DataLoader worker builds it (any number of workers, a resume at any step), and
    W processes see the micro-batches that one process accumulating W of them would."""
    return torch.Generator().manual_seed(derived_seed(seed, index))
