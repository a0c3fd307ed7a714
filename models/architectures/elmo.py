"""ELMo's biLM: two LSTM stacks (models/architectures/lstm.py), one each way, over shared embeddings and LM
head, and the scalar mix of their layers that a task trains (models/specs/architectures/elmo.py)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.architectures.base import Architecture, implemented
from models.architectures.decoder import lm_batch
from models.architectures.encoder import pooled_states
from models.architectures.lstm import LSTMStack
from models.config import ModelConfig
from models.pair import Pair, PairKind
from models.specs.architectures.elmo import ELMoSpec
from models.transformer import Transformer


class ScalarMix(nn.Module):
    """ELMo's task weights over the layers (its eq. 1): softmax-normalised s, a scale γ; at init the
    mean of the layers."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: list[Tensor]) -> Tensor:
        weights = self.weights.softmax(0)
        return self.gamma * sum(w * layer for w, layer in zip(weights, layers, strict=True))


class BiLM(nn.Module):
    """The forward and backward LSTM LMs, and the scalar mix of their layers."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.forward_lm, self.backward_lm = LSTMStack(cfg), LSTMStack(cfg, reverse=True)
        self.mix = ScalarMix(cfg.n_layers + 1)

    def layers(self, x: Tensor, pad_mask: Tensor | None) -> list[Tensor]:
        """ELMo's layers [B, T, 2d]: the embeddings twice, then each layer's two directions."""
        forward, backward = (
            self.forward_lm.layer_states(x, pad_mask),
            self.backward_lm.layer_states(x, pad_mask),
        )
        return [torch.cat([x, x], -1)] + [torch.cat(pair, -1) for pair in zip(forward, backward, strict=True)]

    def forward(self, x: Tensor, pad_mask: Tensor | None, rope: object = None, *context: object) -> Tensor:
        return self.mix(self.layers(x, pad_mask))


class ELMo(ELMoSpec, Architecture):
    def stacks(self, cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
        return BiLM(cfg), None

    def batch(self, pair: Pair) -> dict[str, Tensor]:
        if pair.target_lengths is not None:
            raise ValueError("arch elmo reads whole rows both ways: a pair of rows of different lengths")
        return lm_batch(pair)  # the row but its last token, and the row but its first

    def example_batch(
        self, batch_size: int, kind: PairKind, inputs: int, targets: int, predicted: float
    ) -> dict[str, Tensor]:
        shape, meta = (batch_size, targets - 1), {"dtype": torch.long, "device": "meta"}
        return {"input_ids": torch.zeros(shape, **meta), "labels": torch.zeros(shape, **meta)}

    def hidden(self, model, ids, pad_mask=None, decoder_ids=None, decoder_pad_mask=None, prefix_lengths=None):
        return model.encode(ids, pad_mask)

    def logits_and_labels(
        self, model: Transformer, batch: dict[str, Tensor], hidden: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Both LMs over the row: the forward one reads all but its last token (`input_ids`) and
        predicts each next (`labels`), the backward one reads all but its first (`labels`), right to
        left, and predicts each previous."""
        first, last = batch["input_ids"], batch["labels"]
        bilm = model.encoder
        forward = bilm.forward_lm(model.embed_ids(first), None)
        backward = bilm.backward_lm(model.embed_ids(last), None)
        logits = model.lm_logits(torch.cat([forward, backward], 1))
        return logits.flatten(0, 1), torch.cat([last, first], 1).flatten()

    def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        return pooled_states(model.encode(ids, pad_mask), pad_mask, pooling)

    def pooled_size(self, cfg: ModelConfig) -> int:
        return 2 * cfg.d_model

    def task_parameters(self, model: Transformer) -> list[nn.Parameter]:
        return list(model.encoder.mix.parameters())


ARCHITECTURE = implemented(ELMo())
