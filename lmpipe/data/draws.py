"""Per-document draws that depend on the document alone: a document's split or its place in a sample
is then the same whatever else the corpus holds, so a growing corpus never moves an old document."""

from __future__ import annotations

import hashlib

import numpy as np


def document_draws(ids: list[str], seed: int, purpose: str) -> np.ndarray:
    """A uniform draw in [0, 1) for each document, from its id, the seed and what it decides (so that
    the split and the tokenizer's sample are independent draws)."""
    salt = f"{purpose}\0{seed}\0".encode()
    words = np.fromiter(
        (int.from_bytes(hashlib.blake2b(salt + i.encode(), digest_size=8).digest(), "little") for i in ids),
        dtype=np.uint64,
        count=len(ids),
    )
    return (words >> np.uint64(11)).astype(np.float64) / float(1 << 53)
