"""T5's prefix LM: a decoder-only LM over a pair's inputs and targets concatenated (seqio's prefix-LM
feature converter) that attends fully within the inputs part, causally after it; scored on the
targets only. An aligned pair (a masked LM) is all prefix: UniLM's bidirectional mask in the same
model. Fine-tuning reads the whole input as the prefix."""

from __future__ import annotations

import torch
from torch import Tensor

from models.architectures.base import Architecture, implemented
from models.architectures.decoder import last_state, lm_batch
from models.architectures.encoder import aligned_batch, pooled_states
from models.pair import Pair
from models.specs.architectures.prefix_lm import PrefixLMSpec
from models.transformer import Transformer


class PrefixLM(PrefixLMSpec, Architecture):
    def batch(self, pair: Pair) -> dict[str, Tensor]:
        # the inputs are the prefix: a sequence pair's, or an aligned pair's whole row
        prefix = pair.input_lengths
        if prefix is None:
            prefix = torch.full((len(pair.inputs),), pair.inputs.shape[1], dtype=torch.long)
        converted = aligned_batch(pair) if pair.noise is not None else lm_batch(pair)
        return converted | {"prefix_lengths": prefix}

    def hidden(self, model, ids, pad_mask=None, decoder_ids=None, decoder_pad_mask=None, prefix_lengths=None):
        return model.decode(ids, pad_mask, prefix_lengths=prefix_lengths)

    def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        states = model.decode(ids, pad_mask, prefix_lengths=pad_mask.long().sum(1))
        return last_state(states, pad_mask) if pooling == "last" else pooled_states(states, pad_mask, pooling)


ARCHITECTURE = implemented(PrefixLM())
