"""What an architecture computes: its feature converter (T5's seqio feature converters: an objective's
pair to this architecture's batch), how its hidden states are computed and pooled for fine-tuning. Its
declaration (models/specs/architectures: its stacks, the pairs it takes, its poolings, its tokens for
the FLOPs count) is the class an implementation subclasses."""

from __future__ import annotations

from abc import abstractmethod
from importlib import import_module
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from models.pair import Pair, PairKind
from models.special import SPECIAL
from models.specs.architectures import ARCHITECTURES, ArchitectureSpec

if TYPE_CHECKING:  # the model the methods run on (models/transformer.py builds it from its architecture)
    from models.config import ModelConfig
    from models.transformer import Transformer


class Architecture(ArchitectureSpec):
    """An architecture's implementation: its declaration's subclass (`class Encoder(EncoderSpec,
    Architecture)`), registered by `implemented` as its module is imported."""

    def stacks(self, cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
        """The model's encoder and decoder stacks (None where it has none): the block library's
        transformer stacks (T5's "encoder-decoder, shared": the decoder's stack encodes too)."""
        from models.transformer import Stack

        own_encoder = self.encoder and not cfg.share_encoder_decoder
        encoder = Stack(cfg, cfg.n_layers, causal=False, cross=False) if own_encoder else None
        decoder = Stack(cfg, cfg.decoder_layers, causal=True, cross=self.encoder) if self.decoder else None
        return encoder, decoder

    @abstractmethod
    def batch(self, pair: Pair) -> dict[str, Tensor]:
        """The feature converter: an objective's pair as this architecture's training batch."""

    @abstractmethod
    def hidden(
        self,
        model: Transformer,
        ids: Tensor,
        pad_mask: Tensor | None = None,
        decoder_ids: Tensor | None = None,
        decoder_pad_mask: Tensor | None = None,
        prefix_lengths: Tensor | None = None,
    ) -> Tensor:
        """The hidden states of the last stack."""

    @abstractmethod
    def pooled(self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str) -> Tensor:
        """[B, d]: one state per sequence for a fine-tuning head; `pad_mask` is True on real tokens."""

    def pooled_size(self, cfg: ModelConfig) -> int:
        """The width of `pooled`'s states."""
        return cfg.d_model

    def task_parameters(self, model: Transformer) -> list[nn.Parameter]:
        """The model's weights that only a task trains (ELMo's scalar mix): trained with a frozen
        backbone too."""
        return []

    def pooled_and_lm_loss(
        self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str
    ) -> tuple[Tensor, Tensor]:
        """`pooled`, and the LM loss of the input itself from the same states (GPT-1's fine-tuning)."""
        raise NotImplementedError(f"arch '{self.name}' has no causal LM over its fine-tuning input")

    def logits_and_labels(
        self, model: Transformer, batch: dict[str, Tensor], hidden: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Flat logits and the labels they predict: at `positions` (flat indices) when the batch scores
        only some outputs, the LM head run there alone; from `hidden` when the caller has the states."""
        if hidden is None:  # through the module's call, so that a compiled model runs compiled
            hidden = model(
                batch["input_ids"],
                batch.get("pad_mask"),
                batch.get("decoder_ids"),
                batch.get("decoder_pad_mask"),
                batch.get("prefix_lengths"),
            )
        if "positions" in batch:
            hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["positions"])
            return model.lm_logits(hidden), batch["labels"]
        return model.lm_logits(hidden).flatten(0, 1), batch["labels"].flatten()

    def example_batch(
        self, batch_size: int, kind: PairKind, inputs: int, targets: int, predicted: float
    ) -> dict[str, Tensor]:
        """A batch of these shapes on the meta device (the FLOPs count's)."""
        encoder, decoder, scored = self.tokens(kind, inputs, targets, predicted)
        meta = {"dtype": torch.long, "device": "meta"}
        batch = {"input_ids": torch.zeros(batch_size, encoder or decoder, **meta)}
        if encoder and decoder:
            batch["decoder_ids"] = torch.zeros(batch_size, decoder, **meta)
        n = round(scored * batch_size)
        batch["positions"] = torch.zeros(n, **meta)
        batch["labels"] = torch.zeros(n, **meta)
        return batch


def padding_mask(lengths: Tensor | None, width: int) -> Tensor | None:
    """True on the first `lengths[b]` positions of each row; None when every row is full."""
    if lengths is None:
        return None
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def concatenate(pair: Pair) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's inputs followed by its targets, right-padded: (tokens [B, N], input lengths, total
    lengths): a decoder-only LM's view of a pair (seqio's LM and prefix-LM feature converters)."""
    inputs, targets = pair.inputs, pair.targets
    rows = len(targets)
    full = torch.full((rows,), inputs.shape[1], dtype=torch.long)
    in_len = full if pair.input_lengths is None else pair.input_lengths
    tgt_len = torch.full_like(full, targets.shape[1]) if pair.target_lengths is None else pair.target_lengths
    if pair.input_lengths is None:  # the targets start at one column for every row
        tokens = torch.cat([inputs, targets], dim=1)
        if pair.target_lengths is not None:
            tokens = tokens[:, : int((in_len + tgt_len).max())]
        return tokens, in_len, in_len + tgt_len
    total = in_len + tgt_len
    column = torch.arange(int(total.max()))[None, :]
    from_targets = (column - in_len[:, None]).clamp(0, targets.shape[1] - 1)
    from_inputs = column.clamp(max=max(inputs.shape[1] - 1, 0))
    tokens = torch.where(
        column < in_len[:, None],
        inputs.gather(1, from_inputs.expand(rows, -1)) if inputs.shape[1] else SPECIAL.pad,
        torch.where(column < total[:, None], targets.gather(1, from_targets), SPECIAL.pad),
    )
    return tokens, in_len, total


def shift_right(targets: Tensor) -> Tensor:
    """A decoder's inputs for teacher forcing: <s>, then the targets but the last."""
    start = torch.full_like(targets[:, :1], SPECIAL.bos)
    return torch.cat([start, targets[:, :-1]], dim=1)


IMPLEMENTED: dict[str, Architecture] = {}


def implemented(architecture: Architecture) -> Architecture:
    """Register an implementation (what its module does as it is imported)."""
    IMPLEMENTED[architecture.name] = architecture
    return architecture


def architecture(name: str) -> Architecture:
    """The implementation of the declared architecture `name`: its declaration's module, imported on
    first use (in an export's remote code every implementation is in the one file, already defined).
    lmpipe/codedeps.py counts every registered implementation as code of this module."""
    if name not in IMPLEMENTED:
        import_module(ARCHITECTURES[name].implementation)
    return IMPLEMENTED[name]
