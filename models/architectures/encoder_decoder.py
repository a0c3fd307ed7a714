"""T5's encoder-decoder: the inputs to a bidirectional encoder, the targets to a causal decoder that
cross-attends to it (teacher forcing: the decoder reads <s> and the targets shifted right)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.architectures.base import Architecture, padding_mask, shift_right
from models.architectures.encoder import pooled_states
from models.pair import Pair, PairKind
from models.special import SPECIAL

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    from torch import Tensor

    from models.transformer import Transformer


class EncoderDecoder(Architecture):
    name, encoder, decoder = "encoder_decoder", True, True
    fits = frozenset({"sequence"})
    # the masked mean (or max) of the encoder's states, or the first decoder state (the decoder run on
    # one start token, attending to the whole encoder)
    poolings = ("mean_encoder", "first_decoder", "max_encoder")
    paper_objective, lm_auto_class = "span", "AutoModelForSeq2SeqLM"

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
        import torch

        memory = model.encode(ids, pad_mask)
        if pooling in ("mean_encoder", "max_encoder"):
            return pooled_states(memory, pad_mask, pooling.removesuffix("_encoder"))
        start = torch.full((len(ids), 1), SPECIAL.bos, dtype=ids.dtype, device=ids.device)
        return model.decode(start, None, memory, pad_mask)[:, 0]

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        return inputs, targets, targets
