"""Run the data stages in-process in a directory (shared by the tokenizer and pack tests)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from pathlib import Path

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
