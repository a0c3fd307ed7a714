"""Run the data stages in-process in a directory (shared by the tokenizer and pack tests), and draw
batches from their packed tokens."""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.workdir import Workdir


def stage_main(name: str) -> Callable[..., None]:
    """The entry point of `python -m stages.<name>`, to run in this process."""
    return importlib.import_module(f"stages.{name}").main


def clean_texts(project: Path) -> list[str]:
    """The texts `clean` kept in `project`, in corpus order."""
    import pyarrow.parquet as pq

    from lmpipe.layout import clean_shards

    shards = clean_shards(project / "data/clean")
    return [text for path in shards for text in pq.read_table(path, columns=["text"]).column(0).to_pylist()]


def run_stages(workdir: Workdir, *names: str) -> None:
    """Data stages by name; "pretrain", "<model>" pretrains that model."""
    with contextlib.chdir(workdir.path):
        queue = list(names)
        while queue:
            name = queue.pop(0)
            if name == "pretrain":
                stage_main("pretrain")([queue.pop(0)])
            elif name == "ingest":
                for source in workdir.params["ingest"]["sources"]:
                    stage_main("ingest")([source])
            else:
                stage_main(name)()


def prepared(path: Path, corpus_dir: Path | None, **overrides: object) -> Workdir:
    """A workdir that went through sample/ingest..pack on the sample or on real text."""
    workdir = Workdir(path)
    if corpus_dir is not None:
        workdir.sources(
            real={"path": str(corpus_dir), "include": ["*.txt"], "split_by": "chunks", "max_doc_chars": 8000}
        )
        workdir.set("tokenizer.vocab_size", 8000)
        workdir.set("clean.workers", 2)
    for dotted, value in overrides.items():
        workdir.set(dotted.replace("__", "."), value)
    run_stages(workdir, *(["sample"] if corpus_dir is None else []), "ingest", "clean", "tokenizer", "pack")
    return workdir


def packed_batches(
    project: Path, split: str, train: Any, batch_size: int, count: int, seed: int, pieces: Any = None
) -> list[dict[str, Any]]:
    """`count` batches of `train`'s objective from a packed split: each one's windows (at the
    objective's row length) and noise drawn by its own seeded stream, as pretraining draws them."""
    import numpy as np
    import torch

    from models.objectives.base import batch_generator
    from models.pretraining import make_batch

    meta = json.loads((project / "data/tokens/meta.json").read_text())
    tokens = np.memmap(project / f"data/tokens/{split}.bin", dtype=meta["dtype"], mode="r")
    length, made = train.row_length(), []
    for index in range(count):
        generator = batch_generator(seed, index)
        starts = torch.randint(0, len(tokens) - length, (batch_size,), generator=generator).numpy()
        rows = torch.from_numpy(np.stack([tokens[s : s + length] for s in starts]).astype(np.int64))
        made.append(make_batch(rows, train, generator, meta["vocab_size"], pieces=pieces))
    return made
