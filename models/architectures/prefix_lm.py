"""T5's prefix LM: a decoder-only LM over a pair's inputs and targets concatenated (seqio's prefix-LM
feature converter) that attends fully within the inputs part, causally after it; scored on the
targets only. An aligned pair (a masked LM) is all prefix: UniLM's bidirectional mask in the same
model. Fine-tuning reads the whole input as the prefix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.architectures.base import Architecture
from models.architectures.decoder import last_state, lm_batch
from models.architectures.encoder import aligned_batch, pooled_states
from models.pair import Pair, PairKind

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    from torch import Tensor

    from models.transformer import Transformer


class PrefixLM(Architecture):
    name, encoder, decoder, prefix = "prefix_lm", False, True, True
    fits = frozenset({"aligned", "sequence", "targets_only"})
    # the last real token (the one the LM objective trained to start the continuation), or the mean or
    # max of the states: with the input as the prefix, every position has seen all of it
    poolings = ("last", "mean", "max")
    paper_objective, lm_auto_class = "lm", "AutoModelForCausalLM"

    def batch(self, pair: Pair) -> dict[str, Tensor]:
        import torch

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

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        if kind == "aligned":  # the inputs alone, all of them the prefix
            return 0, inputs, predicted
        return 0, inputs + targets - 1, targets - (inputs == 0)
