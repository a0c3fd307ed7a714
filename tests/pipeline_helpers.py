"""Run the data stages in-process in a directory (shared by the tokenizer and pack tests)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from stages import clean, ingest, pack, pretrain, sample, tokenizer
from tests.conftest import Workdir

STAGES = {"sample": sample, "ingest": ingest, "clean": clean, "tokenizer": tokenizer, "pack": pack}


def run_stages(workdir: Workdir, *names: str) -> None:
    """Data stages by name; "pretrain", "<model>" pretrains that model."""
    with contextlib.chdir(workdir.path):
        queue = list(names)
        while queue:
            name = queue.pop(0)
            if name == "pretrain":
                pretrain.main([queue.pop(0)])
            else:
                STAGES[name].main()


def prepared(path: Path, corpus_dir: Path | None, **overrides: object) -> Workdir:
    """A workdir that went through sample/ingest..pack on the sample or on real text."""
    workdir = Workdir(path)
    if corpus_dir is not None:
        workdir.sources(
            {"name": "real", "path": f"{corpus_dir}/*.txt", "split_by": "chunks", "max_doc_chars": 8000}
        )
        workdir.set("tokenizer.vocab_size", 8000)
        workdir.set("clean.workers", 2)
    for dotted, value in overrides.items():
        workdir.set(dotted.replace("__", "."), value)
    run_stages(workdir, *(["sample"] if corpus_dir is None else []), "ingest", "clean", "tokenizer", "pack")
    return workdir
