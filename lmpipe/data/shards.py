"""A data stage's unit of work: one row group of a parquet file, finished whole or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq


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
