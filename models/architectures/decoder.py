"""GPT's decoder-only LM: causal self-attention over a pair's inputs and targets concatenated (seqio's
LM feature converter), scored on the targets only; with no inputs, every next token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models.architectures.base import Architecture, concatenate, implemented
from models.pair import Pair
from models.specs.architectures.decoder import DecoderSpec
from models.transformer import Transformer


def lm_batch(pair: Pair) -> dict[str, Tensor]:
    """Inputs and targets in one row; each position predicts the next token, scored where that token
    is a target. A full targets-only pair is scored everywhere: no positions needed."""
    tokens, input_lengths, lengths = concatenate(pair)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]} | (pair.extras or {})
    if pair.inputs.shape[1] == 0 and pair.target_lengths is None:
        return batch
    predicted = torch.arange(1, tokens.shape[1])[None, :]  # the column of the token each position predicts
    scored = (predicted >= input_lengths[:, None]) & (predicted < lengths[:, None])
    positions = scored.reshape(-1).nonzero().squeeze(1)
    return batch | {"positions": positions, "labels": batch["labels"].reshape(-1)[positions]}


class Decoder(DecoderSpec, Architecture):
    def batch(self, pair: Pair) -> dict[str, Tensor]:
        return lm_batch(pair)

    def hidden(self, model, ids, pad_mask=None, decoder_ids=None, decoder_pad_mask=None, prefix_lengths=None):
        return model.decode(ids, pad_mask)

    def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        return self.pool(model.decode(ids, pad_mask), pad_mask, pooling)

    def pool(self, states: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        """One state per row of the decoder's states: the last real token's."""
        return last_state(states, pad_mask)

    def pooled_and_lm_loss(
        self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str
    ) -> tuple[Tensor, Tensor]:
        states = model.decode(ids, pad_mask)
        # each real token predicts the next real one, as in pretraining
        labels = ids[:, 1:].masked_fill(~pad_mask[:, 1:], -100)
        logits = model.lm_logits(states[:, :-1])
        lm_loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return self.pool(states, pad_mask, pooling), lm_loss


def last_state(states: Tensor, pad_mask: Tensor) -> Tensor:
    """Each row's state at its last real token (right padding)."""
    last = pad_mask.long().sum(1) - 1
    return states[torch.arange(len(states), device=states.device), last]


ARCHITECTURE = implemented(Decoder())
