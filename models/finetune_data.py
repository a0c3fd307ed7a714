"""Fine-tuning inputs: a sentence or a sentence pair as `[CLS] a [SEP] (b [SEP])`, cut to a length by
taking tokens from the longer side first (as BERT's run_classifier does), and right-padded batches.

Our architectures have no segment embeddings: [SEP] alone marks where the second sentence starts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.special import SPECIAL, SpecialIds


def encode_pair(
    first: list[int], second: list[int] | None, max_len: int, special: SpecialIds = SPECIAL
) -> list[int]:
    """`[CLS] first [SEP]` or `[CLS] first [SEP] second [SEP]`, at most `max_len` ids."""
    first, second = list(first), (list(second) if second is not None else None)
    overhead = 2 if second is None else 3
    if max_len <= overhead:
        raise ValueError(f"max_len {max_len} leaves no room for text after {overhead} special tokens")
    while len(first) + len(second or []) + overhead > max_len:
        (first if second is None or len(first) >= len(second) else second).pop()
    ids = [special.cls, *first, special.sep]
    return ids if second is None else [*ids, *second, special.sep]


def pad_batch(sequences: list[list[int]], pad_id: int = SPECIAL.pad) -> tuple[Tensor, Tensor]:
    """Right-padded ids [B, T] and the mask of real tokens (True), T the longest sequence."""
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        mask[row, : len(sequence)] = True
    return ids, mask
