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
