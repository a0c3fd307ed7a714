"""`ingest`, `clean` and `pack` at scale: units and shards on every core, on a real Dask cluster (2
workers on 127.0.0.1) and after an interruption most of the way give the same bytes as one process
from the start."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpipe.data import ingesting, packing
from lmpipe.data.synthetic import corpus
from lmpipe.layout import CLEAN_STORE, CLEAN_WORK, PACK_STORE, TOKENS, clean_shards, ingest_store
from lmpipe.params.project import load_params
from lmpipe.runtime import StageError
from lmpipe.schemas import NO_META
from stages import clean, ingest, pack, tokenizer
from tests.workdir import ROOT, Workdir

SHARD_ROWS = 40


def outputs(workdir: Workdir) -> dict[str, bytes]:
    """Every file clean writes, by path: its documents and its metrics."""
    files = sorted((workdir.path / "data/clean").iterdir()) + [workdir.path / "metrics/clean.json"]
    return {str(path.relative_to(workdir.path)): path.read_bytes() for path in files}


@pytest.fixture
def sharded(workdir: Workdir) -> Workdir:
    """A source of 1,200 synthetic documents and their planted duplicates, in shards of 40."""
    docs = corpus(11, 1200, 500, 5, 14)
    raw = workdir.path / "data/raw/synthetic"
    raw.mkdir(parents=True)
    ids = [f"d#{i}" for i in range(len(docs))]
    n = len(docs)
    table = pa.table({"id": ids, "source": ["synthetic"] * n, "text": docs, "meta": [NO_META] * n})
    pq.write_table(table, raw / "part-00000.parquet", row_group_size=SHARD_ROWS)
    (raw / "manifest.json").write_text(json.dumps({"name": "synthetic", "synthetic": True}))
    workdir.sources(synthetic={"path": "unused"})
    return workdir


@pytest.fixture
def reference(sharded: Workdir) -> dict[str, bytes]:
    sharded.set("clean.workers", 1)
    clean.main()
    report = json.loads((sharded.path / "metrics/clean.json").read_text())
    assert report["dropped"]["exact_duplicate"] > 0 and report["dropped"]["near_duplicate"] > 0
    assert len(list((sharded.path / "data/clean").glob("part-*.parquet"))) > 1200 // SHARD_ROWS
    assert not (sharded.path / CLEAN_WORK).exists()  # the pairs go once the outputs are in place
    assert (sharded.path / CLEAN_STORE / "index.json").is_file()  # the shards' work stays
    return outputs(sharded)


def forget(workdir: Workdir) -> None:
    """The kept work of earlier runs removed: the next clean judges every shard again."""
    shutil.rmtree(workdir.path / CLEAN_STORE)


def test_every_core_gives_the_bytes_of_one_process(sharded: Workdir, reference: dict[str, bytes]) -> None:
    sharded.set("clean.workers", 2)
    forget(sharded)
    clean.main()
    assert outputs(sharded) == reference


@contextlib.contextmanager
def on_a_local_cluster(workdir: Workdir) -> Iterator[None]:
    """`cluster.scheduler` set to a real Dask cluster of 2 worker processes on 127.0.0.1, for the block."""
    from distributed import LocalCluster

    env = {"PYTHONPATH": str(ROOT)}  # the workers import the stage's functions from the project
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            env=env,
        ) as cluster,
        workdir.changed({"cluster.scheduler": cluster.scheduler_address}),
    ):
        yield


def test_a_local_dask_cluster_gives_the_same_bytes(sharded: Workdir, reference: dict[str, bytes]) -> None:
    forget(sharded)
    with on_a_local_cluster(sharded):
        clean.main()
    assert outputs(sharded) == reference


def test_a_killed_run_resumes_from_its_finished_shards(sharded: Workdir, reference: dict[str, bytes]) -> None:
    metrics = reference["metrics/clean.json"]
    (sharded.path / "metrics/clean.json").write_text("{}")  # to tell a rewrite from the reference
    reference = {**reference, "metrics/clean.json": b"{}"}
    sharded.set("clean.workers", 1)
    forget(sharded)
    judged = sharded.path / CLEAN_STORE / "entries"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "stages.clean"]
    process = subprocess.Popen(command, cwd=sharded.path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if judged.is_dir() and len([p for p in judged.iterdir() if not p.name.startswith(".")]) >= 20:
            break
        time.sleep(0.01)
    assert process.poll() is None, "clean finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert outputs(sharded) == reference  # the previous outputs, untouched by the killed run

    resumed = subprocess.run(command, cwd=sharded.path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    done = int(resumed.stderr.split("clean: ")[1].split(" of ")[0])
    assert " shards judged by an earlier run; judging " in resumed.stderr
    assert 20 <= done < len(list((sharded.path / "data/clean").glob("part-*.parquet")))
    assert outputs(sharded) == {**reference, "metrics/clean.json": metrics}


def pool_workers(pid: int) -> list[int]:
    """The process-pool workers a process started (multiprocessing's spawned children, not its tracker)."""
    workers = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        if parent == pid and b"spawn_main" in command:
            workers.append(int(stat.parent.name))
    return workers


def test_a_worker_killed_mid_shard_fails_in_one_line_and_the_rerun_resumes(
    sharded: Workdir, reference: dict[str, bytes]
) -> None:
    sharded.set("clean.workers", 2)
    sharded.set("clean.max_chars", 800)  # drops the longer part: other outputs than before
    before = outputs(sharded)
    assert before == reference
    judged = sharded.path / CLEAN_STORE / "entries"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "stages.clean"]
    process = subprocess.Popen(command, cwd=sharded.path, env=env, stderr=subprocess.PIPE, text=True)
    deadline, killed = time.monotonic() + 120, None
    while time.monotonic() < deadline and process.poll() is None and killed is None:
        workers = pool_workers(process.pid)
        if workers and judged.is_dir() and any(not p.name.startswith(".") for p in judged.iterdir()):
            killed = workers[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.005)
    assert killed is not None, "clean finished before a worker could be killed"
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("error: clean: a worker process died")
    assert outputs(sharded) == before  # the previous outputs, untouched
    shards = [p for p in judged.iterdir() if not p.name.startswith(".")]
    assert shards and all((p / "counts.json").is_file() for p in shards)  # only whole shards count

    resumed = sharded.run("clean")
    assert resumed.returncode == 0, resumed.stderr
    assert " shards judged by an earlier run; judging " in resumed.stderr
    after_resume = outputs(sharded)
    assert after_resume != before
    sharded.set("clean.workers", 1)
    forget(sharded)
    assert sharded.run("clean").returncode == 0  # uninterrupted, from the start
    assert outputs(sharded) == after_resume


def test_changed_params_start_the_work_over(
    sharded: Workdir, reference: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    index = sharded.path / CLEAN_STORE / "index.json"
    recorded = json.loads(index.read_text())
    recorded["config"]["clean"]["min_words"] += 1  # as if a run with another rule had left it
    index.write_text(json.dumps(recorded))
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        clean.main()
    assert "clean: rebuilding the kept work in" in caplog.text
    assert "it was built with other params (clean.min_words)" in caplog.text
    assert outputs(sharded) == reference
    index.write_text("{half a record")  # a damaged index is never trusted either
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        clean.main()
    assert "index.json is unreadable (JSONDecodeError)" in caplog.text
    assert outputs(sharded) == reference


def tokens(workdir: Workdir) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((workdir.path / TOKENS).iterdir())}


@pytest.fixture
def packed(sharded: Workdir, reference: dict[str, bytes]) -> dict[str, bytes]:
    """pack's outputs from one process, on the 30 clean shards of `sharded`."""
    tokenizer.main()
    pack.main()
    return tokens(sharded)


def test_pack_on_every_core_and_a_dask_cluster_gives_the_bytes_of_one_process(
    sharded: Workdir, packed: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def from_scratch() -> dict[str, bytes]:
        shutil.rmtree(sharded.path / PACK_STORE)  # every shard encoded again, not served from the store
        pack.main()
        return tokens(sharded)

    monkeypatch.setattr(packing, "POOL_DOCS", 0)  # a process per core however small the corpus
    sharded.set("pack.threads", 2)
    assert from_scratch() == packed
    with on_a_local_cluster(sharded):
        assert from_scratch() == packed
    # with the sentence index: its offsets are each shard's, shifted by the shards before it
    sharded.set("pack.sentences", True)
    with_index = from_scratch()
    monkeypatch.setattr(packing, "POOL_DOCS", 10**9)
    assert from_scratch() == with_index and "train.sentences.bin" in with_index


def test_an_interrupted_pack_resumes_from_its_finished_shards(
    sharded: Workdir, packed: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    entries = sharded.path / PACK_STORE / "entries"
    finished = sorted(p for p in entries.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(finished) == len(clean_shards()) > 20  # each shard's tokens, kept after the run
    for folder in finished[20:]:  # what a run killed after its 20th shard had left
        shutil.rmtree(folder)
    (entries / f".{finished[20].name[:16]}.tmp-killed").mkdir()  # and the shard it was writing
    (entries / f".{finished[20].name[:16]}.tmp-killed" / "train.bin").write_bytes(b"half")
    with caplog.at_level("INFO"):
        pack.main()
    assert f"pack: 20 of {len(finished)} shards kept from an earlier run; encoding {len(finished) - 20}" in (
        caplog.text
    )
    assert tokens(sharded) == packed
    assert sorted(p.name for p in entries.iterdir()) == [p.name for p in finished]  # only what it used


@pytest.fixture
def folder_source(workdir: Workdir) -> Workdir:
    """A source `books` of 30 text files and a jsonl file (about 90 kB)."""
    docs = corpus(5, 300, 500, 5, 14)
    folder = workdir.path / "books"
    for i in range(30):
        (folder / f"shelf-{i % 3}").mkdir(parents=True, exist_ok=True)
        (folder / f"shelf-{i % 3}/book-{i:02d}.txt").write_text("\n\n".join(docs[i * 9 : i * 9 + 9]))
    (folder / "zz.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[270:]))
    workdir.sources(books={"path": str(folder), "include": ["**/*.txt", "*.jsonl"]})
    workdir.set("ingest.workers", 1)
    return workdir


def raw(workdir: Workdir) -> dict[str, bytes]:
    """Every file `ingest@books` writes, by path: its parts, manifest and metrics."""
    files = [*sorted((workdir.path / "data/raw/books").iterdir()), workdir.path / "metrics/ingest/books.json"]
    return {str(path.relative_to(workdir.path)): path.read_bytes() for path in files}


def documents(workdir: Workdir) -> pa.Table:
    parts = sorted((workdir.path / "data/raw/books").glob("part-*"))
    return pa.concat_tables(pq.read_table(part) for part in parts)


def test_ingest_units_on_every_core_and_a_dask_cluster_give_the_bytes_of_one_process(
    folder_source: Workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest.main(["books"])
    whole = documents(folder_source)  # one unit: every file read by this process into one part
    assert len(list((folder_source.path / "data/raw/books").glob("part-*"))) == 1
    assert whole.num_rows >= 300 and whole.column("id")[0].as_py() == "books/shelf-0/book-00.txt#0"

    monkeypatch.setattr(ingesting, "UNIT_BYTES", 6000)
    monkeypatch.setattr(ingesting, "UNIT_MIN_BYTES", 375)
    ingest.main(["books"])
    reference = raw(folder_source)
    assert len([p for p in reference if "/part-" in p]) > 5  # a part per unit
    assert documents(folder_source).equals(whole)  # the same documents, ids and order

    def from_scratch() -> dict[str, bytes]:
        shutil.rmtree(folder_source.path / ingest_store("books"))  # every file read again
        ingest.main(["books"])
        return raw(folder_source)

    folder_source.set("ingest.workers", 2)
    assert from_scratch() == reference
    with on_a_local_cluster(folder_source):
        assert from_scratch() == reference


def files_read(caplog: pytest.LogCaptureFixture) -> int:
    """How many files the last ingest of `books` read (the rest came from the store)."""
    return int(caplog.text.rsplit("ingest books: read ", 1)[1].split(" of ")[0])


def test_a_failed_ingest_resumes_from_its_finished_units_and_rereads_the_failed_one(
    folder_source: Workdir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ingesting, "UNIT_BYTES", 6000)
    monkeypatch.setattr(ingesting, "UNIT_MIN_BYTES", 375)
    jsonl = folder_source.path / "books/zz.jsonl"
    good = jsonl.read_text()
    jsonl.write_text(good + "{not json\n")  # the last unit's file: every unit before it finishes
    with pytest.raises(StageError, match=r"zz.jsonl:\d+: malformed JSON line"):
        ingest.main(["books"])
    assert not (folder_source.path / "data/raw/books").exists()  # no partial output
    entries = folder_source.path / ingest_store("books") / "entries"
    finished = [p for p in entries.iterdir() if not p.name.startswith(".")]
    assert len(finished) > 5 and all((p / "counts.json").is_file() for p in finished)

    jsonl.write_text(good)  # fixed: its unit is read again, the others are not
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        ingest.main(["books"])
    files = ingesting.resolve_files(load_params().ingest.sources["books"], "books")
    last_unit = ingesting.units_of(files, folder_source.path / "books")[-1]
    assert files_read(caplog) == len(last_unit.files) < len(files)
    resumed = raw(folder_source)
    shutil.rmtree(folder_source.path / ingest_store("books"))
    ingest.main(["books"])  # from the start
    assert raw(folder_source) == resumed


def test_an_added_changed_or_removed_file_is_the_only_one_read_with_the_bytes_of_a_run_from_scratch(
    folder_source: Workdir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ingesting, "UNIT_BYTES", 6000)
    monkeypatch.setattr(ingesting, "UNIT_MIN_BYTES", 375)
    ingest.main(["books"])
    books = folder_source.path / "books"
    extra = "\n\n".join(corpus(7, 9, 500, 5, 14))

    def from_scratch() -> dict[str, bytes]:
        grown = raw(folder_source)
        shutil.rmtree(folder_source.path / ingest_store("books"))
        ingest.main(["books"])
        assert raw(folder_source) == grown
        return grown

    for change, read in [
        (lambda: (books / "shelf-1/book-14b.txt").write_text(extra), 1),  # added mid-corpus
        (lambda: (books / "shelf-2/book-05.txt").write_text(extra + "\n\nA new last page."), 1),
        (lambda: (books / "shelf-0/book-00.txt").unlink(), 0),  # the first file removed
    ]:
        change()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lmpipe"):
            ingest.main(["books"])
        assert files_read(caplog) == read
        from_scratch()


def test_a_long_unit_logs_its_progress(
    folder_source: Workdir, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One very large file is one unit: its worker says how far it is (here at every document)."""
    monkeypatch.setattr(ingesting, "UNIT_LOG_S", 0.0)
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        ingest.main(["books"])
    progress = [r.message for r in caplog.records if r.message.startswith("ingest books, unit 1: ")]
    assert len(progress) > 300 and "% done, ETA" in progress[-1]
