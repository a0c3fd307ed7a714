"""A corpus that grows: an added, changed or removed file costs that file (ingest reads it alone, clean
judges and pack encodes its shards alone), and the outputs are the bytes of a run from scratch of the
same params on the same files; also when a new document duplicates an old one and comes first, so
that an old shard is written again."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lmpipe.data import ingesting
from lmpipe.data.shards import row_group_digests
from lmpipe.data.synthetic import corpus
from lmpipe.layout import CLEAN_STORE, PACK_STORE, ingest_store
from lmpipe.runtime import sha256_file
from tests.pipeline_helpers import run_stages
from tests.workdir import ROOT, Workdir

DATA_OUTPUTS = ("data/raw", "data/clean", "data/tokens", "metrics/ingest", "metrics/clean.json")


def outputs(workdir: Workdir) -> dict[str, bytes]:
    """Every file the data stages after the tokenizer write, by path."""
    files = []
    for name in DATA_OUTPUTS:
        path = workdir.path / name
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {str(p.relative_to(workdir.path)): p.read_bytes() for p in files}


def clean_texts(workdir: Workdir) -> list[str]:
    parts = sorted((workdir.path / "data/clean").glob("part-*.parquet"))
    return [text for part in parts for text in pq.read_table(part, columns=["text"]).column(0).to_pylist()]


@pytest.fixture
def growing(workdir: Workdir, monkeypatch: pytest.MonkeyPatch) -> Workdir:
    """A folder of 24 files of 12 documents each, ingested, cleaned, tokenized and packed once."""
    # units of about 4 to 7 files, as a large corpus has units of many: a unit ends past 16 kB after a
    # file whose name draws an end (book-03, 09, 11, 14, 15, 17, 18, 22 here); a file of 2,000
    # characters or more is a row group of its own, as a book is
    monkeypatch.setattr(ingesting, "UNIT_MIN_BYTES", 16_000)
    monkeypatch.setattr(ingesting, "FILE_GROUP_CHARS", 2_000)  # each file a row group: a shard of clean's
    docs = corpus(3, 288, 400, 4, 10)
    folder = workdir.path / "books"
    folder.mkdir()
    for i in range(24):
        (folder / f"book-{i:02d}.txt").write_text("\n\n".join(docs[i * 12 : i * 12 + 12]))
    workdir.sources(books={"path": str(folder), "include": ["*.txt"]})
    workdir.set("ingest.workers", 1)  # in this process, where the sizes above are set
    workdir.set("clean.min_words", 10)
    workdir.set("tokenizer.vocab_size", 400)
    run_stages(workdir, "ingest", "clean", "tokenizer", "pack")
    return workdir


def grown_then_from_scratch(workdir: Workdir, caplog: pytest.LogCaptureFixture) -> tuple[dict, dict, str]:
    """The outputs of an incremental run (the tokenizer kept as it was), its log, and the outputs of a
    run from scratch on the same files with the same tokenizer."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        run_stages(workdir, "ingest", "clean", "pack")
    grown, log = outputs(workdir), caplog.text
    for store in (ingest_store("books"), CLEAN_STORE, PACK_STORE):
        shutil.rmtree(workdir.path / store)
    run_stages(workdir, "ingest", "clean", "pack")
    return grown, outputs(workdir), log


def test_each_change_costs_its_file_and_gives_the_bytes_of_a_run_from_scratch(
    growing: Workdir, caplog: pytest.LogCaptureFixture
) -> None:
    books = growing.path / "books"
    shards = len(list((growing.path / "data/clean").glob("part-*.parquet")))
    parts = sorted((growing.path / "data/clean").glob("part-*.parquet"))
    kept = [row for part in parts for row in pq.read_table(part, columns=["id", "text"]).to_pylist()]
    old = next(row["text"] for row in kept if row["id"].startswith("books/book-20.txt#"))
    # an added file: its first document duplicates one of book-20's, and comes first in the corpus;
    # it joins the unit of book-04 to book-09, the only unit it changes, as a shard of its own
    added = "\n\n".join([old, *corpus(8, 10, 400, 4, 10)])
    (books / "book-03b.txt").write_text(added)
    assert not ingesting.ends_a_unit("book-03b.txt")
    grown, scratch, log = grown_then_from_scratch(growing, caplog)
    assert grown == scratch
    assert "ingest books: read 1 of 25 files" in log
    judged = re.search(r"clean: (\d+) of (\d+) shards judged by an earlier run; judging (\d+)", log)
    assert judged and int(judged[3]) == 1 and int(judged[2]) == shards + 1  # the new file's shard
    encoded = re.search(r"pack: (\d+) of (\d+) shards kept from an earlier run; encoding (\d+)", log)
    # the new shard, and book-20's, whose document the new one now stands for
    assert encoded and int(encoded[3]) == 2 and int(encoded[2]) == shards + 1
    assert clean_texts(growing).count(old) == 1

    (books / "book-11.txt").write_text(added.replace(old, "A changed first page of many words " * 3))
    grown, scratch, log = grown_then_from_scratch(growing, caplog)
    assert grown == scratch and "ingest books: read 1 of 25 files" in log

    (books / "book-03b.txt").unlink()  # book-20's document is its shard's own again
    grown, scratch, log = grown_then_from_scratch(growing, caplog)
    assert grown == scratch and "ingest books: read 0 of 24 files" in log
    judged = re.search(r"clean: (\d+) of (\d+) shards judged by an earlier run; judging (\d+)", log)
    assert judged and int(judged[3]) == 0  # its unit's other files are their own shards, kept
    assert clean_texts(growing).count(old) == 1


def test_a_damaged_entry_is_computed_again_and_never_trusted(
    growing: Workdir, caplog: pytest.LogCaptureFixture
) -> None:
    before = outputs(growing)
    entries = growing.path / PACK_STORE / "entries"
    victim = next(p for p in sorted(entries.iterdir()) if (p / "train.bin").is_file())
    (victim / "train.bin").write_bytes(
        b"\0" * (victim / "train.bin").stat().st_size
    )  # same size, other bytes
    (growing.path / CLEAN_STORE / "index.json").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        run_stages(growing, "ingest", "clean", "pack")
    assert (
        f"pack: kept entry {victim.name[:16]} is damaged (train.bin is not the bytes it recorded)"
        in caplog.text
    )
    assert f"clean: rebuilding the kept work in {(growing.path / CLEAN_STORE).resolve()}: no index.json" in (
        caplog.text
    )
    assert outputs(growing) == before


def test_an_entry_touched_but_not_changed_is_hashed_and_kept(
    growing: Workdir, caplog: pytest.LogCaptureFixture
) -> None:
    """Size and mtime as they were recorded: the entry is trusted unread; an mtime that moved makes its
    bytes checked again, and the same bytes keep it."""
    before = outputs(growing)
    entries = growing.path / PACK_STORE / "entries"
    touched = next(p for p in sorted(entries.iterdir()) if (p / "train.bin").is_file())
    os.utime(touched / "train.bin", ns=(0, 0))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        run_stages(growing, "pack")
    assert "damaged" not in caplog.text
    assert re.search(r"pack: (\d+) of \1 shards kept from an earlier run; encoding 0", caplog.text)
    assert outputs(growing) == before


def test_inputs_whose_stat_has_not_moved_are_not_read_for_their_digests(
    growing: Workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digests of the source files and of the raw and clean parts' row groups are kept by each
    file's size, mtime and inode: a run over the same files reads none of them, and a changed file is
    the only source file read again (with the parts of its unit, which are new files)."""
    hashed: list[str] = []
    monkeypatch.setattr(ingesting, "sha256_file", lambda path: hashed.append(path.name) or sha256_file(path))
    monkeypatch.setattr(
        "lmpipe.data.shards.row_group_digests",
        lambda path: hashed.append(path.name) or row_group_digests(path),
    )
    run_stages(growing, "ingest", "clean", "pack")
    assert hashed == []
    book = growing.path / "books/book-05.txt"
    book.write_text(book.read_text() + "\n\n" + corpus(9, 1, 400, 4, 10)[0])
    run_stages(growing, "ingest", "clean", "pack")
    assert [name for name in hashed if name.endswith(".txt")] == ["book-05.txt"]
    parts = [*(growing.path / "data/raw/books").glob("part-*"), *(growing.path / "data/clean").glob("part-*")]
    assert 0 < len([name for name in hashed if name.startswith("part-")]) < len(parts) / 2


def test_a_store_of_other_params_is_rebuilt_with_the_reason(
    growing: Workdir, caplog: pytest.LogCaptureFixture
) -> None:
    growing.set("ingest.sources.books.max_doc_chars", 3000)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        run_stages(growing, "ingest")
    store = (growing.path / ingest_store("books")).resolve()
    reason = "it was built with other params (ingest.sources.books.max_doc_chars)"
    assert f"ingest books: rebuilding the kept work in {store}: {reason}" in caplog.text
    assert "read " not in caplog.text  # every file read: no line of what was kept


def test_the_store_is_beside_the_outputs_not_in_them(growing: Workdir) -> None:
    kept = growing.path / "data/.kept"
    assert {p.name for p in kept.iterdir()} == {"ingest", "clean", "pack"}
    for stage in ("raw", "clean", "tokens"):
        assert not any(p.name.startswith(".") for p in (growing.path / "data" / stage).rglob("*"))
    assert Path(growing.path / "data/.kept/pack/index.json").is_file()


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_a_kill_at_any_moment_of_an_incremental_run_leaves_the_next_run_the_same_bytes(
    growing: Workdir,
) -> None:
    """SIGKILL at several moments of each stage's incremental run (starting up, working, writing its
    outputs, pruning its store): its outputs are the previous ones or the whole new ones, and the runs
    after give the bytes of a run from scratch."""
    books = growing.path / "books"
    (books / "book-07b.txt").write_text("\n\n".join(corpus(9, 12, 400, 4, 10)))
    (books / "book-16.txt").unlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for stage, args, folder in (
        ("ingest", ["books"], "data/raw"),
        ("clean", [], "data/clean"),
        ("pack", [], "data/tokens"),
    ):
        before, seen = files_under(growing.path / folder), []
        for delay in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
            command = [sys.executable, "-m", f"stages.{stage}", *args]
            process = subprocess.Popen(command, cwd=growing.path, env=env, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            process.send_signal(signal.SIGKILL)
            process.wait()
            seen.append(files_under(growing.path / folder))
        finished = growing.run(stage, *args)
        assert finished.returncode == 0, finished.stderr
        after = files_under(growing.path / folder)
        assert after != before and all(snapshot in (before, after) for snapshot in seen), stage
    grown = outputs(growing)
    for store in (ingest_store("books"), CLEAN_STORE, PACK_STORE):
        shutil.rmtree(growing.path / store)
    for stage, args in (("ingest", ["books"]), ("clean", []), ("pack", [])):  # as the runs above: processes
        assert growing.run(stage, *args).returncode == 0
    assert outputs(growing) == grown


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
