"""A data stage's unit of work: one row group of a parquet file, finished whole or not at all."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from lmpipe.data.store import StatMemo


@dataclass(frozen=True)
class Shard:
    """One row group of a parquet file."""

    index: int
    path: str
    row_group: int
    offset: int  # the corpus index of its first document
    rows: int


def shards_of(files: list[Path]) -> list[Shard]:
    """Every row group of the files, in order."""
    shards, offset = [], 0
    for path in files:
        meta = pq.read_metadata(path)
        for group in range(meta.num_row_groups):
            rows = meta.row_group(group).num_rows
            shards.append(Shard(len(shards), str(path.resolve()), group, offset, rows))
            offset += rows
    return shards


def shard_digests(files: list[Path], memo: StatMemo) -> dict[tuple[str, int], str]:
    """(path as `shards_of` gives it, row group) -> sha256 of the row group's bytes in the file (its
    column chunks, compressed): a shard's content, wherever it sits, read without decoding it; a file
    whose stat has not moved since a run kept its digests in `memo` is not read."""
    digests = {}
    for path in files:
        for group, digest in enumerate(memo.get(path, row_group_digests)):
            digests[str(path.resolve()), group] = digest
    memo.save()
    return digests


def row_group_digests(path: Path) -> list[str]:
    meta = pq.read_metadata(path)
    digests = []
    with open(path, "rb") as handle:
        for group in range(meta.num_row_groups):
            digest = hashlib.sha256()
            for column in range(meta.num_columns):
                chunk = meta.row_group(group).column(column)
                start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
                handle.seek(start)
                digest.update(handle.read(chunk.total_compressed_size))
            digests.append(digest.hexdigest())
    return digests
