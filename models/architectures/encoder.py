"""BERT's encoder: bidirectional self-attention; it predicts in place, so it trains on aligned pairs
(the masked LM), scored at the corrupted positions only."""

from __future__ import annotations

from torch import Tensor

from models.architectures.base import Architecture, implemented, padding_mask
from models.pair import Pair
from models.specs.architectures.encoder import EncoderSpec
from models.transformer import Transformer


class Encoder(EncoderSpec, Architecture):
    def batch(self, pair: Pair) -> dict[str, Tensor]:
        return aligned_batch(pair)

    def hidden(self, model, ids, pad_mask=None, decoder_ids=None, decoder_pad_mask=None, prefix_lengths=None):
        return model.encode(ids, pad_mask)

    def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        states = model.encode(ids, pad_mask)
        return states[:, 0] if pooling == "cls" else pooled_states(states, pad_mask, pooling)


def aligned_batch(pair: Pair) -> dict[str, Tensor]:
    """An aligned pair in place: the inputs, scored at the noise against the original tokens."""
    positions = pair.noise.reshape(-1).nonzero().squeeze(1)
    batch = {"input_ids": pair.inputs, "positions": positions, "labels": pair.targets.reshape(-1)[positions]}
    if pair.input_lengths is not None:
        batch["pad_mask"] = padding_mask(pair.input_lengths, pair.inputs.shape[1])
    return batch | (pair.extras or {})


def masked_mean(states: Tensor, pad_mask: Tensor) -> Tensor:
    """The mean of each row's states over its real tokens."""
    weights = pad_mask.unsqueeze(-1).to(states.dtype)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1)


def masked_max(states: Tensor, pad_mask: Tensor) -> Tensor:
    """The elementwise max of each row's states over its real tokens."""
    return states.masked_fill(~pad_mask.unsqueeze(-1), float("-inf")).amax(1)


def pooled_states(states: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
    """`mean` or `max` over each row's real tokens."""
    return masked_max(states, pad_mask) if pooling == "max" else masked_mean(states, pad_mask)


ARCHITECTURE = implemented(Encoder())
