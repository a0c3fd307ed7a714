"""Dai & Le's LSTM language model (2015, "Semi-supervised Sequence Learning"), and the LSTM stack ELMo's
directions are made of: embeddings, then LSTM layers (d_ff cells projected to d_model where wider,
as ELMo's LSTMP; a residual connection from the second layer on, as ELMo's), then the tied LM head.
It reads a pair as GPT's decoder does; the order comes from the recurrence, so it takes no positions."""

from __future__ import annotations

from typing import Any

from models.specs.architectures.base import register
from models.specs.architectures.decoder import DecoderSpec


def lstm_flops(model: Any, batch: int, tokens: int) -> tuple[int, int]:
    """Per layer and token, the four gates' input and recurrent matmuls (and the projection where the
    cells are wider than the model); the first step's recurrent matmul reads the zero initial state,
    which has no gradient: its backward costs it once."""
    cells, width = model.d_ff, model.d_model
    out = width if cells != width else cells  # the projected state, what the next step reads
    per_token = 2 * 4 * cells * (width + out) + (2 * cells * width if cells != width else 0)
    first_step = 2 * batch * 4 * cells * out
    return model.n_layers * batch * tokens * per_token, model.n_layers * first_step


def check_cells(arch: str, model: Any) -> None:
    """An LSTM stack's d_ff cells a layer are projected to d_model: never fewer."""
    if model.d_ff < model.d_model:
        raise ValueError(
            f"d_ff: arch {arch}'s {model.d_ff} cells a layer are projected to d_model ({model.d_model}), "
            "so they cannot be fewer"
        )


class LSTMSpec(DecoderSpec):
    name = "lstm"
    fits = frozenset({"sequence", "targets_only"})
    poolings = ("last", "mean", "max")  # Dai & Le classify from the last state
    paper_objective, lm_auto_class = "clm", "AutoModelForCausalLM"
    export_classes = ()
    remote_because = "transformers has no LSTM language model"
    implementation = "models.architectures.lstm"
    positions = ("none",)
    transformer_blocks = False

    def check_model(self, model: Any) -> None:
        super().check_model(model)
        check_cells(self.name, model)

    def stack_flops(self, model: Any, batch: int, tokens: int) -> tuple[int, int]:
        return lstm_flops(model, batch, tokens)


ARCHITECTURE = register(LSTMSpec())
