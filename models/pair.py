"""The pair an objective makes and an architecture's feature converter reads (T5's inputs, targets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor


# aligned: the targets are the inputs' original tokens, position by position, scored where `noise` is
# set (BERT's masked LM: an encoder predicts in place); sequence: the targets follow the inputs (an
# encoder-decoder's decoder, or a decoder-only LM over the two concatenated); targets_only: no inputs
# at all (GPT's LM: a decoder over the targets)
PairKind = Literal["aligned", "sequence", "targets_only"]


@dataclass
class Pair:
    """An objective's (inputs, targets) for a batch of rows, right-padded with the pad id where rows
    differ in length; `*_lengths` say where each row's real tokens end (None: every row is full)."""

    inputs: Tensor  # [B, I]
    targets: Tensor  # [B, T]
    input_lengths: Tensor | None = None  # [B]
    target_lengths: Tensor | None = None  # [B]
    noise: Tensor | None = None  # [B, I] bool, aligned pairs: the corrupted positions, the scored ones
    # an objective's own tensors, passed into the batch as they are (ELECTRA's sampling uniforms)
    extras: dict[str, Tensor] | None = None


def stacked_pairs(pairs: list[Pair]) -> Pair:
    """Pairs of one row each as one batch, right-padded with the pad id where their rows differ."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    from models.special import SPECIAL

    def column(
        rows: list[Tensor], lengths: list[Tensor | None], pad: int | bool
    ) -> tuple[Tensor, Tensor | None]:
        real = [row[0] if n is None else row[0, : int(n[0])] for row, n in zip(rows, lengths, strict=True)]
        widths = torch.tensor([len(row) for row in real])
        if bool((widths == widths[0]).all()):
            return torch.stack(real), None
        return pad_sequence(real, batch_first=True, padding_value=pad), widths

    input_lengths = [p.input_lengths for p in pairs]
    inputs, in_len = column([p.inputs for p in pairs], input_lengths, SPECIAL.pad)
    targets, tgt_len = column([p.targets for p in pairs], [p.target_lengths for p in pairs], SPECIAL.pad)
    noise = None
    if pairs[0].noise is not None:
        noise, _ = column([p.noise for p in pairs], input_lengths, False)
    return Pair(inputs, targets, in_len, tgt_len, noise)
