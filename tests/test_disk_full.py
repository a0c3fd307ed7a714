"""A disk that fills mid-stage: one line and a non-zero exit, the previous outputs intact, no partial
shard left to pass for a finished one, and a clean finish once there is room again.

The project lives on a small tmpfs that the test fills; mounting one needs root (or CAP_SYS_ADMIN), and
the test skips, saying so, where that is not allowed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmpipe.data.synthetic import corpus
from lmpipe.layout import CLEAN_STORE
from tests.workdir import Workdir


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {mounted.stderr.strip()}")
    monkeypatch.chdir(disk)
    try:
        yield disk
    finally:
        monkeypatch.chdir(tmp_path)
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Take all but `leave` bytes of the disk's free space."""
    filler = disk / "filler"
    with filler.open("wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, shutil.disk_usage(disk).free - leave)
    return filler


def snapshot(root: Path, *folders: str) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for folder in folders
        for path in sorted((root / folder).rglob("*"))
        if path.is_file()
    }


def hidden_leftovers(folder: Path) -> list[str]:
    """Temporaries of an atomic write (dot-named), anywhere under `folder`."""
    return [str(p) for p in folder.rglob(".*")] if folder.exists() else []


def test_a_full_disk_fails_in_one_line_and_keeps_the_previous_outputs(small_disk: Path) -> None:
    project = Workdir(small_disk)
    docs = corpus(5, 6000, 500, 5, 14)
    (small_disk / "corpus.txt").write_text("\n\n".join(docs), encoding="utf-8")
    project.sources(text={"path": "corpus.txt"})
    for stage in ("ingest", "clean"):
        done = project.run(stage, *(["text"] if stage == "ingest" else []))
        assert done.returncode == 0, done.stderr
    before = snapshot(small_disk, "data", "metrics")

    project.set("clean.workers", 2)  # the error comes back from a pool worker
    project.set("clean.max_chars", 800)  # drops the longer part of the corpus
    shutil.rmtree(small_disk / CLEAN_STORE)  # the kept work too: its room is not what the run fills
    filler = fill(small_disk, leave=1_000_000)
    failed = project.run("clean")
    assert failed.returncode == 2, failed.stderr
    assert "Traceback" not in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: clean: ") and "No space left on device" in last, last
    assert snapshot(small_disk, "data/raw", "data/clean", "metrics") == {
        k: v for k, v in before.items() if not k.startswith("data/.")
    }
    assert hidden_leftovers(small_disk / "data/clean") == []
    entries = small_disk / CLEAN_STORE / "entries"
    shards = list(entries.iterdir()) if entries.exists() else []
    assert not [p for p in shards if p.name.startswith(".")]  # no half-written shard
    assert all((shard / "counts.json").is_file() for shard in shards)

    project.set("ingest.sources.text.max_doc_chars", 5000)
    failed_ingest = project.run("ingest", "text")
    assert failed_ingest.returncode == 2 and "Traceback" not in failed_ingest.stderr, failed_ingest.stderr
    assert "No space left on device" in failed_ingest.stderr.strip().splitlines()[-1]
    assert snapshot(small_disk, "data/raw") == {k: v for k, v in before.items() if k.startswith("data/raw")}

    filler.unlink()
    project.set("ingest.sources.text.max_doc_chars", 100_000)
    finished = project.run("clean")
    assert finished.returncode == 0, finished.stderr
    old_clean = {k: v for k, v in before.items() if k.startswith("data/clean")}
    assert snapshot(small_disk, "data/clean") != old_clean
