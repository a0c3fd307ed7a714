"""Outputs appear whole or not at all, and a killed writer's leftovers do not outlive the next write."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmpipe.runtime import atomic_dir, atomic_file


def test_failed_write_leaves_the_old_output_and_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "out" / "pretrained"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("two")
        raise RuntimeError("the stage failed")
    assert (target / "a.txt").read_text() == "one"
    assert sorted(p.name for p in target.parent.iterdir()) == ["pretrained"]


def test_a_killed_writers_leftovers_go_with_the_next_write(tmp_path: Path) -> None:
    folder = tmp_path / "cola"
    folder.mkdir()
    # what SIGKILL left: a half-written directory, a half-renamed old one, a temporary file
    (folder / ".pretrained.tmp-guuhfs31").mkdir()
    (folder / ".pretrained.tmp-guuhfs31" / "part.parquet").write_bytes(b"half")
    (folder / ".pretrained.old-4242").mkdir()
    (folder / ".summary.json.tmp-x1y2").write_text("{")
    (folder / ".scratch.tmp-keep").mkdir()  # another output's: its own next write removes it
    with atomic_dir(folder / "pretrained") as tmp:
        (tmp / "a.txt").write_text("whole")
    with atomic_file(folder / "summary.json") as handle:
        handle.write("{}")
    assert sorted(p.name for p in folder.iterdir()) == [".scratch.tmp-keep", "pretrained", "summary.json"]
