"""What an architecture is: the stacks it builds, its feature converter (T5's seqio feature converters:
an objective's pair to this architecture's batch), how its hidden states are computed, its poolings for
fine-tuning and its shapes for the FLOPs count."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from models.pair import Pair, PairKind
from models.special import SPECIAL

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    from torch import Tensor

    from models.transformer import Transformer


class Architecture(ABC):
    name: ClassVar[str]
    encoder: ClassVar[bool]  # builds a bidirectional encoder stack
    decoder: ClassVar[bool]  # builds a causal decoder stack (cross-attending to the encoder, if any)
    prefix: ClassVar[bool] = False  # a decoder that attends fully within a prefix (prefix_lengths)
    fits: ClassVar[frozenset[PairKind]]  # the pairs its converter can express
    poolings: ClassVar[tuple[str, ...]]  # fine-tuning's choices, the default first
    # its fine-tuning reads the input as a causal LM, so GPT-1's auxiliary LM loss applies to it
    # (`pooled_and_lm_loss`, `finetune.common.lm_loss_weight`)
    finetune_lm_loss: ClassVar[bool] = False
    paper_objective: ClassVar[str]  # the objective the paper that made it trained it with
    lm_auto_class: ClassVar[str]  # the transformers Auto class of its LM head (a remote-code export)

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

    def pooled_and_lm_loss(
        self, model: Transformer, ids: Tensor, pad_mask: Tensor, pooling: str
    ) -> tuple[Tensor, Tensor]:
        """`pooled`, and the LM loss of the input itself from the same states (GPT-1's fine-tuning)."""
        raise NotImplementedError(f"arch '{self.name}' has no causal LM over its fine-tuning input")

    @abstractmethod
    def tokens(self, kind: PairKind, inputs: int, targets: int, predicted: float) -> tuple[int, int, float]:
        """(encoder tokens, decoder tokens, predicted tokens) per row of a pair of this kind and widths."""

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
        import torch

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
    import torch

    if lengths is None:
        return None
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def concatenate(pair: Pair) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's inputs followed by its targets, right-padded: (tokens [B, N], input lengths, total
    lengths): a decoder-only LM's view of a pair (seqio's LM and prefix-LM feature converters)."""
    import torch

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
    import torch

    start = torch.full_like(targets[:, :1], SPECIAL.bos)
    return torch.cat([start, targets[:, :-1]], dim=1)
