"""GPT's causal LM: the next token at every position of a row (documents separated by EOS)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.objectives.base import Args, Objective
from models.transformer import Transformer


def causal_lm_batch(tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Inputs and next-token targets of [B, T+1] rows; documents in a row are separated by EOS."""
    return tokens[:, :-1], tokens[:, 1:]


class CausalLM(Objective):
    name, arch = "clm", "decoder"

    def row_length(self, seq_len: int, args: Args) -> int:
        return seq_len + 1  # the inputs and the shifted targets

    def batch(
        self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int
    ) -> dict[str, Tensor]:
        inputs, targets = causal_lm_batch(rows)
        return {"input_ids": inputs, "labels": targets}

    def logits_and_labels(self, model: Transformer, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return model.lm_logits(model(batch["input_ids"])).flatten(0, 1), batch["labels"].flatten()

    def lengths(self, batch_size: int, seq_len: int, args: Args) -> tuple[int, int, int]:
        return seq_len, 0, batch_size * seq_len


OBJECTIVE = CausalLM()
