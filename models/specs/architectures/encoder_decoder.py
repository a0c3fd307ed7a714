"""T5's encoder-decoder: the inputs to a bidirectional encoder, the targets to a causal decoder that
cross-attends to it (teacher forcing: the decoder reads <s> and the targets shifted right)."""

from __future__ import annotations

from models.pair import PairKind
from models.specs.architectures.base import ArchitectureSpec, register


class EncoderDecoderSpec(ArchitectureSpec):
    name, encoder, decoder = "encoder_decoder", True, True
    fits = frozenset({"sequence"})
    # the masked mean (or max) of the encoder's states, or the first decoder state (the decoder run on
    # one start token, attending to the whole encoder)
    poolings = ("mean_encoder", "first_decoder", "max_encoder")
    paper_objective, lm_auto_class = "span", "AutoModelForSeq2SeqLM"
    remote_because = "no transformers encoder-decoder has ours (BART and mBART normalise the embeddings)"
    implementation = "models.architectures.encoder_decoder"

    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        return inputs, targets, targets


ARCHITECTURE = register(EncoderDecoderSpec())
