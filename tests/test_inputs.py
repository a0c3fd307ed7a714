"""Inputs outside the project are dependencies: DVC hashes a source's `path` and `glue.path`, so that
adding, editing, removing or renaming a file makes exactly the stages that read it stale, a touched
but unchanged file does not, and the run cache restores only outputs of the same input content."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmpipe.data.synthetic import corpus, glue_files
from tests.project import changed_deps, make_project, sh, stages_ran

SOURCES = ["ingest@books", "ingest@wiki"]
BOOKS = 120  # documents in the books folder as the fixture writes it


def status(project: Path) -> dict[str, list[str]]:
    """Stage -> its changed dependencies, for the data stages this module reproduces."""
    return {stage: sorted(deps) for stage, deps in changed_deps(project, "pack", "glue_prepare").items()}


def repro(project: Path) -> list[str]:
    return stages_ran(sh(project, "dvc", "repro", "pack", "glue_prepare").stdout)


def documents(project: Path, source: str) -> int:
    return json.loads((project / f"metrics/ingest/{source}.json").read_text())["documents"]


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two corpus folders and a GLUE TSV folder outside the project."""
    root = tmp_path_factory.mktemp("outside")
    docs = corpus(7, 240, 300, 5, 12)
    for folder, part in (("books", docs[:120]), ("wiki", docs[120:])):
        (root / folder).mkdir()
        for i in range(4):
            (root / folder / f"part-{i}.txt").write_text("\n\n".join(part[i::4]) + "\n")
    for task, files in glue_files(7, 300, 200, 100).items():
        (root / "glue" / task).mkdir(parents=True)
        for name, text in files.items():
            (root / "glue" / task / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, outside: Path) -> Path:
    def edit(params: dict) -> None:
        params["ingest"]["sources"] = {
            name: {"path": str(outside / name), "include": ["*.txt"]} for name in ("books", "wiki")
        }
        params["glue"].update(path=str(outside / "glue"), tasks=["stsb"])
        params["clean"]["workers"] = 1
        params["tokenizer"]["vocab_size"] = 512

    path = make_project(tmp_path_factory.mktemp("inputs") / "project", edit)
    ran = repro(path)
    assert set(ran) == {*SOURCES, "clean", "tokenizer", "pack", "glue_prepare"}  # `sample` is not needed
    assert status(path) == {} and documents(path, "books") == BOOKS
    return path


def test_an_added_file_makes_only_its_source_stale_and_is_read(project: Path, outside: Path) -> None:
    before = documents(project, "books")
    (outside / "books/part-9.txt").write_text("\n\n".join(corpus(8, 30, 300, 5, 12)) + "\n")
    assert status(project) == {"ingest@books": [str(outside / "books")]}
    assert repro(project) == ["ingest@books", "clean", "tokenizer", "pack"]
    assert documents(project, "books") > before
    assert status(project) == {}


def test_an_edited_file_is_stale_and_a_touched_one_is_not(project: Path, outside: Path) -> None:
    path = outside / "wiki/part-1.txt"
    stat = path.stat()
    os.utime(path, (stat.st_atime + 100, stat.st_mtime + 100))  # touched, same bytes
    assert status(project) == {}
    path.write_text(path.read_text() + "\nOne more paragraph about the harbour and the ships in it.\n")
    assert status(project) == {"ingest@wiki": [str(outside / "wiki")]}
    assert repro(project)[0] == "ingest@wiki"


def test_a_removed_or_renamed_file_is_stale(project: Path, outside: Path) -> None:
    books = outside / "books"
    held = documents(project, "books")
    (books / "part-3.txt").rename(books / "part-7.txt")
    assert status(project) == {"ingest@books": [str(books)]}
    assert repro(project)[0] == "ingest@books"  # the document ids name the file
    (books / "part-7.txt").rename(books / "part-3.txt")
    restored = sh(project, "dvc", "repro", "pack").stdout
    # the folder holds what it held before: DVC's run cache, keyed by the content, restores that run's
    # outputs
    assert "Stage 'ingest@books' is cached - skipping run, checking out outputs" in restored
    assert documents(project, "books") == held
    text = (books / "part-3.txt").read_text()
    (books / "part-3.txt").unlink()
    assert status(project) == {"ingest@books": [str(books)]}
    (books / "part-3.txt").write_text(text)
    assert status(project) == {}


def test_an_edited_glue_tsv_reruns_glue_prepare_only(project: Path, outside: Path) -> None:
    dev = outside / "glue/STS-B/dev.tsv"
    lines = dev.read_text().splitlines(keepends=True)
    dev.write_text("".join(lines[:-1]))
    assert status(project) == {"glue_prepare": [str(outside / "glue")]}
    assert repro(project) == ["glue_prepare"]
    manifest = json.loads((project / "data/glue/manifest.json").read_text())
    assert manifest["rows"]["stsb"]["validation"] == len(lines) - 2  # a header and the removed row
