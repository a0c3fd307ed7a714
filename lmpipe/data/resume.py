"""A data stage's work folder: the shards an interrupted run finished, each written whole, kept for the
next run only when it would compute the same (the same params, input files and code); the stage removes
the folder once its outputs are in place."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from lmpipe.codedeps import code_digest


@dataclass(frozen=True)
class Shard:
    """One row group of a parquet file: the unit of a data stage's work, finished whole or not at all."""

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


def fingerprint(config: object, files: Iterable[Path], module: str) -> str:
    """What a work folder's results depend on: the config (JSON), the inputs (path, size, mtime) and
    the code of `module`'s import closure."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    digest.update(code_digest(module).encode())
    return digest.hexdigest()


def prepare(work: Path, stamp: str) -> None:
    """Keep `work` if an interrupted run of the same fingerprint left it, else start it empty."""
    marker = work / "FINGERPRINT"
    if work.exists() and (not marker.exists() or marker.read_text() != stamp):
        shutil.rmtree(work)  # another run's: other params, inputs or code
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp)
