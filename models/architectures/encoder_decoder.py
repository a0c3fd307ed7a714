"""T5's encoder-decoder: the inputs to a bidirectional encoder, the targets to a causal decoder that
cross-attends to it (teacher forcing: the decoder reads <s> and the targets shifted right)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.architectures.base import Architecture, implemented, padding_mask, shift_right
from models.architectures.encoder import pooled_states
from models.pair import Pair
from models.special import SPECIAL
from models.specs.architectures.encoder_decoder import EncoderDecoderSpec
from models.transformer import Transformer


class EncoderDecoder(EncoderDecoderSpec, Architecture):
    def batch(self, pair: Pair) -> dict[str, Tensor]:
        batch = {"input_ids": pair.inputs, "decoder_ids": shift_right(pair.targets), "labels": pair.targets}
        if pair.input_lengths is not None:
            batch["pad_mask"] = padding_mask(pair.input_lengths, pair.inputs.shape[1])
        if pair.target_lengths is not None:
            # padded targets come after every real one: the causal decoder needs no mask, only scores
            scored = padding_mask(pair.target_lengths, pair.targets.shape[1])
            batch["positions"] = scored.reshape(-1).nonzero().squeeze(1)
            batch["labels"] = pair.targets.reshape(-1)[batch["positions"]]
        return batch

    def hidden(self, model, ids, pad_mask=None, decoder_ids=None, decoder_pad_mask=None, prefix_lengths=None):
        if decoder_ids is None:
            raise ValueError("an encoder-decoder needs decoder_ids")
        memory = model.encode(ids, pad_mask)
        return model.decode(decoder_ids, decoder_pad_mask, memory, pad_mask)

    def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        memory = model.encode(ids, pad_mask)
        if pooling in ("mean_encoder", "max_encoder"):
            return pooled_states(memory, pad_mask, pooling.removesuffix("_encoder"))
        start = torch.full((len(ids), 1), SPECIAL.bos, dtype=ids.dtype, device=ids.device)
        return model.decode(start, None, memory, pad_mask)[:, 0]


ARCHITECTURE = implemented(EncoderDecoder())
