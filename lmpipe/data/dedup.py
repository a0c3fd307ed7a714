"""Exact and near-duplicate removal at any corpus size, as phases over files on disk (the shape of
datatrove's and Dolma's dedup), never one index of the whole corpus in memory.

1. Per shard (in parallel): each document that passes the quality rules gets its MinHash signature cut
   into LSH bands (datasketch's MinHash; the band count and width that datasketch's MinHashLSH picks
   for the threshold) and a 128-bit exact key; both are written beside the shard.
2. Per band and hash range: one sort finds the documents that share a band value (near-duplicate
   candidates, as MinHashLSH would return them) or an exact key; each such run gives pairs (first, other).
3. Connected components over the pairs: an out-of-core union-find whose parent array is a file mapped
   into memory (8 bytes per document) and whose pairs stream in file by file; every component keeps its
   first document in corpus order. The result does not depend on the order of shards or pairs.
4. Per shard (in parallel): keep the documents that are their component's first.

A hash range holds at most `PART_DOCS` documents, so the sort of phase 2 stays within a fixed memory
whatever the corpus size.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from datasketch import MinHashLSH

PART_DOCS = 4_000_000  # documents per sort in phase 2: ~100 MB of keys and indices
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band): datasketch's choice for the Jaccard threshold."""
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return lsh.b, lsh.r


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that spreads every input bit."""
    with np.errstate(over="ignore"):
        return _splitmix(x)


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))  # a new array: the rest is in place
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, num_perm) MinHash values -> (bands, documents) one 64-bit hash per band."""
    out = np.empty((bands, len(signatures)), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for band in range(bands):
            h = np.full(len(signatures), np.uint64(band) * _GOLDEN, dtype=np.uint64)
            for value in signatures[:, band * rows : (band + 1) * rows].T:
                h = mix64(h ^ value.astype(np.uint64))
            out[band] = h
    return out


def partitions(documents: int) -> int:
    """Hash ranges per band: a power of two that keeps each sort under PART_DOCS documents."""
    return 1 << max(0, int(np.ceil(np.log2(max(documents, 1) / PART_DOCS))))


def in_partition(keys: np.ndarray, part: int, parts: int) -> np.ndarray:
    """Which keys (their first 64-bit column) fall in hash range `part` of `parts`."""
    if parts == 1:
        return np.ones(len(keys), dtype=bool)
    shift = np.uint64(64 - int(np.log2(parts)))
    return (keys >> shift) == np.uint64(part)


def run_pairs(keys: np.ndarray, index: np.ndarray) -> np.ndarray:
    """(2, m) pairs (first, other) of the documents `index` whose keys are equal: `keys` is (n,) or
    (n, k) uint64; `first` is the smallest index of its run."""
    if len(index) < 2:
        return np.empty((2, 0), dtype=np.int64)
    columns = [keys] if keys.ndim == 1 else [keys[:, i] for i in range(keys.shape[1])]
    order = np.lexsort([index, *reversed(columns)])  # by key, then by index
    sorted_keys = [c[order] for c in columns]
    starts = np.ones(len(order), dtype=bool)
    same = np.ones(len(order) - 1, dtype=bool)
    for column in sorted_keys:
        same &= column[1:] == column[:-1]
    starts[1:] = ~same
    run = np.cumsum(starts) - 1
    first = index[order][starts][run]
    other = index[order]
    duplicate = ~starts
    return np.stack([first[duplicate], other[duplicate]]).astype(np.int64)


def _roots(parent: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    roots = parent[nodes]
    while True:
        up = parent[roots]
        if np.array_equal(up, roots):
            parent[nodes] = roots  # path compression: the next lookups are one step
            return roots
        roots = up


def union(parent: np.ndarray, pairs: np.ndarray) -> None:
    """Join the components of every pair: the larger root points at the smaller, so a component's root
    is its smallest index whatever order the pairs come in."""
    a, b = pairs
    while len(a):
        ra, rb = _roots(parent, a), _roots(parent, b)
        apart = ra != rb
        if not apart.any():
            return
        lo, hi = np.minimum(ra[apart], rb[apart]), np.maximum(ra[apart], rb[apart])
        np.minimum.at(parent, hi, lo)
        a, b = a[apart], b[apart]


def components(path: Path, documents: int, pair_files: Iterable[Path]) -> np.ndarray:
    """A file-backed array: each document's component root (itself when it has no duplicate)."""
    parent = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(documents,))
    parent[:] = np.arange(documents, dtype=np.int64)
    for pair_file in pair_files:
        union(parent, np.load(pair_file))
    for start in range(0, documents, PART_DOCS):  # every entry its root, for the filter's lookups
        _roots(parent, np.arange(start, min(start + PART_DOCS, documents)))  # (compresses each path)
    parent.flush()
    return parent
