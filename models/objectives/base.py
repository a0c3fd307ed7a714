"""What an objective's implementation computes, and the random stream its batches draw from.

As in T5's own code, an objective only makes `(inputs, targets)` from a batch of rows of tokens; the
architecture's feature converter (models/architectures) turns that pair into its batch. So any
objective trains any architecture whose converter can express the pair's kind. Its declaration
(models/specs/objectives) says which kind, and what its params are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch import Tensor, nn

from models.config import ModelConfig
from models.pair import Pair
from models.specs.objectives.base import ObjectiveParams
from models.training import derived_seed

Pieces = Mapping[str, Tensor]  # the tokenizer's piece tables by name (models/pieces.py)
NO_PIECES: Pieces = MappingProxyType({})


@dataclass
class Terms:
    """What a pretraining step computes: the objective's token loss (validation's `val/loss`), its
    correct predictions and predicted tokens; losses beside it, each with its weight in the step's
    sum (a pair loss, ELECTRA's replaced-token detection), accuracies logged by name, and other
    shares logged by name (ELECTRA's replaced share and recall: what its accuracy is read against)."""

    loss: Tensor
    correct: Tensor
    count: int
    extra: dict[str, tuple[Tensor, float]] = field(default_factory=dict)
    accuracies: dict[str, Tensor] = field(default_factory=dict)
    rates: dict[str, Tensor] = field(default_factory=dict)
    weight: float = 1.0  # the token loss's in the step's sum (DistilBERT's alpha_mlm)

    def logged(self) -> dict[str, Tensor]:
        """What is logged beside the token loss, by metric name: each extra loss, accuracy and share."""
        losses = {f"{name}_loss": loss.detach() for name, (loss, _) in self.extra.items()}
        accuracies = {f"{name}_accuracy": accuracy for name, accuracy in self.accuracies.items()}
        return losses | accuracies | self.rates

    def total(self) -> Tensor:
        """What the step minimises: the token loss and the extra losses, each at its weight."""
        return self.weight * self.loss + sum(weight * loss for loss, weight in self.extra.values())


class ObjectiveImplementation(ABC):
    """What an objective computes (its declaration's `implementation` module holds one as
    `IMPLEMENTATION`): the pair it makes of rows and, where it trains one, its own head."""

    @abstractmethod
    def pair(
        self,
        rows: Tensor,
        params: ObjectiveParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        """The pair of `rows` under the declaration's `params`; `pieces` holds the tokenizer's piece tables
        its declaration's `piece_tables` names (models/pieces.py), by name."""

    def head(self, model: ModelConfig, params: ObjectiveParams) -> nn.Module | None:
        """A pretraining-only module that computes the step's `Terms` from the model and the batch in
        place of the LM head (ELECTRA's generator and discriminator head), trained beside the model and
        left out of its export; None: the model's tied LM head on the pair's targets."""
        return None

    def example_extras(self, batch: dict[str, Tensor], params: ObjectiveParams) -> dict[str, Tensor]:
        """The pair's `extras` for the architecture's example `batch` (its input_ids [B, T] and its
        scored tokens' labels), on the meta device (the FLOPs count's example batch)."""
        return {}

    def head_flops(
        self, model: ModelConfig, batch_size: int, seq_len: int, params: ObjectiveParams
    ) -> int | None:
        """The forward FLOPs of `head` beside the model's stacks (which it runs once), for the
        estimate; None: the tied LM head on the predicted tokens."""
        return None


def batch_generator(seed: int, index: int) -> torch.Generator:
    """The RNG of one micro-batch by its index across processes (micro-step × processes + rank): the
    same masks whichever DataLoader worker builds it (any number of workers, a resume at any step), and
    W processes see the micro-batches that one process accumulating W of them would."""
    return torch.Generator().manual_seed(derived_seed(seed, index))
