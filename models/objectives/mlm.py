"""BERT's masked LM: select non-special tokens at `mask_rate`; of those `mask_fraction` become [MASK],
`random_fraction` a random token, the rest are kept; the loss is on the selected tokens only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from models.objectives.base import Args, Objective
from models.special import SPECIAL, SpecialIds
from models.transformer import Transformer


@dataclass
class MaskedBatch:
    input_ids: Tensor  # [B, T] with the selected tokens replaced
    positions: Tensor  # [N] flat indices into B*T of the selected tokens, ascending
    labels: Tensor  # [N] the original tokens there


def mask_tokens(
    tokens: Tensor,
    generator: torch.Generator,
    vocab_size: int,
    rate: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    special: SpecialIds = SPECIAL,
) -> MaskedBatch:
    if not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be in (0, 1), got {rate}")
    if mask_fraction < 0 or random_fraction < 0 or mask_fraction + random_fraction > 1.0:
        raise ValueError(
            f"mask_fraction ({mask_fraction}) and random_fraction ({random_fraction}) must be >= 0 "
            "and sum to at most 1"
        )
    if vocab_size <= special.n_special:
        raise ValueError(f"vocab_size ({vocab_size}) must exceed the {special.n_special} special ids")
    flat = tokens.reshape(-1)
    selected = (torch.rand(flat.shape, generator=generator) < rate) & (flat >= special.n_special)
    positions = selected.nonzero().squeeze(1)
    labels = flat[positions]
    choice = torch.rand(positions.shape, generator=generator)
    random_ids = torch.randint(special.n_special, vocab_size, positions.shape, generator=generator)
    replaced = torch.where(
        choice < mask_fraction,
        torch.full_like(labels, special.mask),
        torch.where(choice < mask_fraction + random_fraction, random_ids, labels),
    )
    inputs = flat.clone()
    inputs[positions] = replaced
    return MaskedBatch(inputs.view_as(tokens), positions, labels)


class MaskedLM(Objective):
    name, arch = "mlm", "encoder"

    def batch(
        self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int
    ) -> dict[str, Tensor]:
        masked = mask_tokens(
            rows, generator, vocab_size, args["mask_rate"], args["mask_fraction"], args["random_fraction"]
        )
        return {"input_ids": masked.input_ids, "positions": masked.positions, "labels": masked.labels}

    def logits_and_labels(self, model: Transformer, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        hidden = model(batch["input_ids"])
        # LM head and loss only where a token was selected: the main speed lever at small sizes
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["positions"])
        return model.lm_logits(hidden), batch["labels"]

    def lengths(self, batch_size: int, seq_len: int, args: Args) -> tuple[int, int, int]:
        return seq_len, 0, round(args["mask_rate"] * batch_size * seq_len)  # the expected selection

    def example_batch(self, batch_size: int, seq_len: int, args: Args) -> dict[str, Tensor]:
        _, _, predicted = self.lengths(batch_size, seq_len, args)
        meta = {"dtype": torch.long, "device": "meta"}
        return {
            "input_ids": torch.zeros(batch_size, seq_len, **meta),
            "positions": torch.zeros(predicted, **meta),
            "labels": torch.zeros(predicted, **meta),
        }


OBJECTIVE = MaskedLM()
