"""`ingest`: every reader and every bad-input case of the issue, on real files written by the tests."""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpipe.runtime import StageError
from stages import ingest
from tests.workdir import ROOT

PARA = "The committee met on Tuesday and agreed on a plan for the new library building."


def run(workdir) -> None:
    """`ingest@<name>` of every source, in order."""
    for name in workdir.params["ingest"]["sources"]:
        ingest.main([name])


def raw_texts(workdir) -> list[str]:
    names = workdir.params["ingest"]["sources"]
    files = [f for name in names for f in sorted((workdir.path / "data/raw" / name).glob("*.parquet"))]
    return [t for f in files for t in pq.read_table(f).column("text").to_pylist()]


def metrics(workdir, name: str = "src") -> dict:
    return json.loads((workdir.path / "metrics/ingest" / f"{name}.json").read_text())


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_every_format_and_gzip(workdir) -> None:
    src = workdir.path / "src"
    records = [{"text": f"{PARA} Record {i}.", "meta": i} for i in range(3)]
    write(src / "a.txt", f"{PARA} One.\n\n{PARA} Two.\n")
    write(src / "b.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    write(src / "c.json", json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), src / "d.parquet")
    pd.DataFrame(records).to_csv(src / "e.csv", index=False)
    for name in ["a.txt", "b.jsonl", "c.json", "d.parquet", "e.csv"]:
        write(src / "gz" / f"{name}.gz", gzip.compress((src / name).read_bytes()))
    workdir.sources(plain={"path": "src", "include": ["*.*"]}, zipped={"path": "src/gz"})
    run(workdir)
    assert metrics(workdir, "plain")["documents"] == 2 + 3 * 4
    assert metrics(workdir, "zipped")["documents"] == 2 + 3 * 4
    texts = raw_texts(workdir)
    assert texts.count(f"{PARA} Record 1.") == 8
    frame = pq.read_table(workdir.path / "data/raw/plain/part-00000.parquet").to_pandas()
    assert list(frame.columns) == ["id", "source", "text", "meta"]
    assert frame["id"].is_unique and set(frame["source"]) == {"plain"}
    assert "plain/a.txt#0" in set(frame["id"])  # relative to the source: the same wherever it lives


def test_split_modes_and_max_doc_chars(workdir) -> None:
    paras = [f"Paragraph {i}. {PARA}" for i in range(10)]
    write(workdir.path / "book.txt", "\n\n".join(paras) + "\n")
    workdir.sources(src={"path": "book.txt", "split_by": "chunks", "max_doc_chars": 400})
    run(workdir)
    docs = raw_texts(workdir)
    assert all(len(d) <= 400 for d in docs) and [d.count("Paragraph") for d in docs] == [4, 4, 2]
    assert "\n\n".join(docs) == "\n\n".join(paras)
    workdir.sources(src={"path": "book.txt", "split_by": "file", "max_doc_chars": 100_000})
    run(workdir)
    assert raw_texts(workdir) == ["\n\n".join(paras)]


def test_bom_and_crlf_are_removed(workdir) -> None:
    write(workdir.path / "win.txt", ("\ufeff" + f"{PARA}\r\nsame paragraph\r\n\r\n{PARA}\r\n").encode())
    workdir.sources(src={"path": "win.txt"})
    run(workdir)
    assert raw_texts(workdir) == [f"{PARA}\nsame paragraph", PARA]


def test_invalid_utf8_policies(workdir) -> None:
    write(workdir.path / "bad.txt", PARA.encode() + b" caf\xe9 \xff\n\n" + PARA.encode() + b"\n")
    workdir.sources(src={"path": "bad.txt"})
    run(workdir)
    assert raw_texts(workdir) == [f"{PARA} caf\ufffd \ufffd", PARA]
    assert metrics(workdir)["invalid_utf8_bytes_replaced"] == 2

    workdir.set("ingest.encoding_errors", "skip")
    run(workdir)
    assert raw_texts(workdir) == [PARA]
    assert metrics(workdir)["invalid_utf8_documents_skipped"] == 1

    workdir.set("ingest.encoding_errors", "fail")
    with pytest.raises(StageError, match=r"bad.txt:1: invalid UTF-8 byte 0xe9 at offset 83"):
        run(workdir)


def test_binary_and_empty_files_are_skipped_counted_and_named(workdir, caplog) -> None:
    write(workdir.path / "src/good.txt", PARA)
    write(workdir.path / "src/image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    write(workdir.path / "src/empty.txt", b"")
    write(workdir.path / "src/blank.txt", b"  \n\n ")
    workdir.sources(src={"path": "src", "include": ["*.txt"]})
    with caplog.at_level(logging.WARNING, logger="lmpipe"):
        run(workdir)
    assert raw_texts(workdir) == [PARA]
    total = metrics(workdir)
    assert total["binary_files_skipped"] == 1 and total["empty_files"] == 2 and total["files"] == 4
    assert "src/image.txt: binary file (NUL bytes), skipped" in caplog.text
    assert "src/empty.txt: empty file, skipped" in caplog.text


def test_one_50mb_line_becomes_bounded_documents(workdir) -> None:
    words = ("lorem ipsa dolor sit amet consectetur " * 1_400_000)[: 50 * 1024 * 1024]
    write(workdir.path / "huge.txt", words + "\n")
    workdir.sources(src={"path": "huge.txt", "max_doc_chars": 100_000})
    run(workdir)
    docs = raw_texts(workdir)
    assert all(len(d) <= 100_000 for d in docs)
    assert sum(len(d) for d in docs) >= len(words.strip()) - len(docs)  # only cut whitespace is lost
    assert len(docs) == pytest.approx(len(words) / 100_000, rel=0.02)


def test_missing_path_and_empty_include_are_named(workdir) -> None:
    write(workdir.path / "src/a.md", PARA)
    workdir.sources(src={"path": "src", "include": ["*.txt", "**/*.gz"]})
    with pytest.raises(StageError, match=r"sources.src.include: \*.txt, \*\*/\*.gz matches no file in 'src'"):
        run(workdir)
    workdir.sources(src={"path": "missing.jsonl"})
    with pytest.raises(StageError, match=r"ingest.sources.src.path: 'missing.jsonl' does not exist"):
        run(workdir)


def test_hidden_files_and_folders_are_not_read(workdir) -> None:
    write(workdir.path / "src/a.txt", PARA)
    write(workdir.path / "src/.hidden.txt", PARA + " hidden")
    write(workdir.path / "src/.git/b.txt", PARA + " in git")
    write(workdir.path / "src/sub/c.txt", PARA + " nested")
    workdir.sources(src={"path": "src"})
    run(workdir)
    assert raw_texts(workdir) == [PARA, PARA + " nested"]


def test_malformed_jsonl_fails_with_file_and_line_or_is_skipped(workdir) -> None:
    lines = [json.dumps({"text": PARA}), '{"text": "unterminated', "[1, 2]", json.dumps({"text": PARA + "!"})]
    write(workdir.path / "d.jsonl", "\n".join(lines) + "\n")
    workdir.sources(src={"path": "d.jsonl"})
    with pytest.raises(StageError, match=r"d.jsonl:2: malformed JSON line \(Unterminated string"):
        run(workdir)
    workdir.set("ingest.on_malformed", "skip")
    run(workdir)
    assert raw_texts(workdir) == [PARA, PARA + "!"]
    assert metrics(workdir)["malformed_records_skipped"] == 2


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl", "json"])
def test_table_without_text_column_lists_its_columns(workdir, fmt: str) -> None:
    records = [{"body": PARA, "title": "x"}]
    path = workdir.path / f"t.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    elif fmt == "csv":
        pd.DataFrame(records).to_csv(path, index=False)
    elif fmt == "jsonl":
        write(path, json.dumps(records[0]) + "\n")
    else:
        write(path, json.dumps(records))
    workdir.sources(src={"path": f"t.{fmt}"})
    with pytest.raises(StageError) as info:
        run(workdir)
    assert str(info.value) == (
        f"t.{fmt}: no text column 'text' (ingest.sources.src.text_column); its columns are: body, title"
    )
    workdir.sources(src={"path": f"t.{fmt}", "text_column": "body"})
    run(workdir)
    assert raw_texts(workdir) == [PARA]


def test_truncated_gzip_is_an_error(workdir) -> None:
    data = gzip.compress((PARA + "\n\n").encode() * 2000)
    write(workdir.path / "cut.txt.gz", data[: len(data) // 2])
    workdir.sources(src={"path": "cut.txt.gz"})
    with pytest.raises(StageError, match=r"cut.txt.gz: truncated gzip file"):
        run(workdir)


def _save_to_disk_then_damage(folder: Path, damage: str) -> None:
    import datasets

    datasets.Dataset.from_dict({"text": [PARA] * 3}).save_to_disk(str(folder))
    if damage == "info":
        write(folder / "dataset_info.json", "{not json")
    else:
        for arrow in folder.glob("*.arrow"):
            write(arrow, "text, not Arrow")


# a file that is not what its name says, and a damaged save_to_disk folder: (source, its files, the line)
NOT_WHAT_THEY_SAY = {
    "text as parquet": (
        {"path": "c"},
        {"c/a.txt": PARA, "c/b.parquet": "text, not Parquet\n" * 5},
        "error: c/b.parquet: not a readable Parquet file (Parquet magic bytes not found in footer.",
    ),
    "gzipped text as parquet": (
        {"path": "c.parquet.gz"},
        {"c.parquet.gz": gzip.compress(b"text, not Parquet\n")},
        "error: c.parquet.gz: not a readable Parquet file (Parquet magic bytes not found in footer.",
    ),
    "truncated parquet": (
        {"path": "c.parquet"},
        {"c.parquet": b"PAR1" + bytes(range(100)) + b"PAR1"},
        "error: c.parquet: not a readable Parquet file (Parquet file size is 108 bytes",
    ),
    "binary jsonl": (
        {"path": "c.jsonl"},
        {"c.jsonl": bytes(range(128, 256)) * 20},
        "error: c.jsonl:1: malformed JSON line (Expecting value, column 1)",
    ),
    "csv with a quote never closed": (
        {"path": "c.csv"},
        {"c.csv": f'text,n\n"{PARA}",1\n"{PARA},2\n{PARA},3\n'},
        "error: c.csv:3: malformed CSV row (unexpected end of data)",
    ),
    "save_to_disk with broken info": (
        {"kind": "disk", "path": "ds"},
        "info",
        "error: ingest.sources.src.path 'ds': not a readable datasets save_to_disk folder (Expecting",
    ),
    "save_to_disk with text for Arrow": (
        {"kind": "disk", "path": "ds"},
        "arrow",
        "error: ingest.sources.src.path 'ds': not a readable datasets save_to_disk folder (",
    ),
}


@pytest.mark.parametrize("case", list(NOT_WHAT_THEY_SAY))
def test_a_file_that_is_not_what_its_name_says_is_one_line(workdir, case: str) -> None:
    source, files, line = NOT_WHAT_THEY_SAY[case]
    if isinstance(files, str):
        _save_to_disk_then_damage(workdir.path / "ds", files)
    else:
        for name, data in files.items():
            write(workdir.path / name, data)
    workdir.sources(src=source)
    with pytest.raises(StageError) as info:  # run_main prints it as `error: <line>`, exit 2
        run(workdir)
    assert f"error: {info.value}".startswith(line), info.value
    assert "\n" not in str(info.value)


def test_a_broken_csv_row_is_skipped_and_counted_under_skip(workdir) -> None:
    rows = f'text,n\n"{PARA}",1\n"{PARA}"x,2\nshort\n"{PARA} Again.",4\n'
    write(workdir.path / "c.csv", rows)
    workdir.sources(src={"path": "c.csv"})
    workdir.set("ingest.on_malformed", "skip")
    run(workdir)
    assert raw_texts(workdir) == [PARA, PARA + " Again."]
    assert metrics(workdir)["malformed_records_skipped"] == 2


def test_failed_run_leaves_previous_outputs_untouched(workdir) -> None:
    write(workdir.path / "src/ok.txt", PARA)
    workdir.sources(src={"path": "src"})
    run(workdir)
    raw = workdir.path / "data/raw"
    before = {p.relative_to(raw): p.read_bytes() for p in raw.rglob("*") if p.is_file()}
    metrics_before = (workdir.path / "metrics/ingest/src.json").read_bytes()
    write(workdir.path / "src/bad.jsonl", "{oops\n")
    result = workdir.run("ingest", "src")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: src/bad.jsonl:1: malformed JSON line")
    assert "Traceback" not in result.stderr
    assert {p.relative_to(raw): p.read_bytes() for p in raw.rglob("*") if p.is_file()} == before
    assert (workdir.path / "metrics/ingest/src.json").read_bytes() == metrics_before
    assert [p.name for p in raw.iterdir()] == ["src"]  # no temporary leftovers
    result = workdir.run("ingest", "nosuch")
    assert result.returncode == 2 and "the sources (ingest.sources): src" in result.stderr


def test_save_to_disk_folder_and_hf_builder_offline(workdir) -> None:
    import datasets

    rows = {"text": [PARA, PARA + " Again."], "label": [0, 1]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(workdir.path / "ds"))
    lines = "".join(json.dumps({"text": f"{PARA} {i}"}) + "\n" for i in range(5))
    write(workdir.path / "local/local.jsonl", lines)
    workdir.sources(
        disk={"kind": "disk", "path": "ds"},
        builder={"kind": "hf", "path": "local", "data_files": "local.jsonl", "max_documents": 3},
    )
    run(workdir)
    assert metrics(workdir, "disk")["documents"] == 2 and metrics(workdir, "builder")["documents"] == 3
    workdir.sources(src={"kind": "disk", "path": "ds", "split": "test"})
    with pytest.raises(
        StageError, match=r"ingest.sources.src.split: 'test' is not in ds; its splits are: train"
    ):
        run(workdir)


def test_glue_source_is_the_distinct_train_text_without_labels(workdir) -> None:
    from stages import glue_prepare

    glue = workdir.path / "glue"
    write(glue / "SST-2/train.tsv", "sentence\tlabel\na fine film \t1\na  dull film\t0\na fine film\t1\n")
    write(glue / "SST-2/dev.tsv", "sentence\tlabel\nthe dev sentence\t1\n")
    rte = "index\tsentence1\tsentence2\tlabel\n0\tA premise that is long.\ta fine film\tentailment\n"
    write(glue / "RTE/train.tsv", rte)
    workdir.set("glue.path", "glue")
    workdir.set("glue.tasks", ["sst2", "rte"])
    workdir.set("finetune.tasks", {t: {} for t in ["sst2", "rte"]})
    write(glue / "RTE/dev.tsv", rte)
    glue_prepare.main()
    tasks = {"kind": "glue", "path": "data/glue", "tasks": ["sst2", "rte"], "max_doc_chars": 100}
    workdir.sources(tasks=tasks)
    run(workdir)
    frame = pq.read_table(workdir.path / "data/raw/tasks/part-00000.parquet").to_pandas()
    assert frame["text"].tolist() == ["a fine film\na dull film", "A premise that is long."]
    assert frame["id"].tolist() == ["tasks/sst2/train#0", "tasks/rte/train#0"]  # RTE's dev.tsv is not read
    assert metrics(workdir, "tasks") == {
        "characters": 46,
        "documents": 2,
        "sentences": 3,
        "train_rows": 4,
    }
    workdir.sources(src={"kind": "glue", "path": "data/glue", "tasks": ["sst2", "sst3"]})
    with pytest.raises(StageError, match=r"ingest.sources.src.tasks\[1\]: unknown GLUE task 'sst3'"):
        run(workdir)
    workdir.sources(src={"kind": "glue", "path": "data/glue", "tasks": ["cola"]})
    with pytest.raises(StageError, match=r"task 'cola' is not in 'data/glue'; it holds: rte, sst2"):
        run(workdir)
    workdir.sources(src={"kind": "glue", "path": "glue"})
    with pytest.raises(StageError, match=r"'glue' is not a folder glue_prepare wrote"):
        run(workdir)


def test_a_source_without_documents_is_an_error(workdir) -> None:
    write(workdir.path / "empty.txt", b"")
    workdir.sources(src={"path": "empty.txt"})
    with pytest.raises(StageError, match="ingest.sources.src: no documents in 'empty.txt'"):
        run(workdir)
    assert not (workdir.path / "data/raw/src").exists()


def test_real_corpus(workdir, corpus_dir: Path) -> None:
    workdir.sources(
        books={"path": str(corpus_dir), "include": ["*.txt"], "split_by": "chunks", "max_doc_chars": 8000}
    )
    run(workdir)
    report = metrics(workdir, "books")
    assert report["files"] == len(list(corpus_dir.glob("*.txt")))
    texts = raw_texts(workdir)
    assert all(0 < len(t) <= 8000 for t in texts)
    assert not any("\r" in t or "\ufeff" in t for t in texts)  # Pride and Prejudice has BOM + CRLF
    assert any("Elizabeth" in t for t in texts) and any("Pierre" in t for t in texts)


def run_with_peak(workdir, source: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`python -m stages.ingest <source>` and its own peak RSS in MB (VmHWM starts anew at exec;
    ru_maxrss would count the fork)."""
    code = (
        "import atexit, runpy, sys; atexit.register(lambda: print(next(line for line in "
        "open('/proc/self/status') if line.startswith('VmHWM')), file=sys.stderr)); "
        f"sys.argv = ['stages.ingest', {source!r}]; "
        "runpy.run_module('stages.ingest', run_name='__main__', alter_sys=True)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir.path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result, int(result.stderr.split("VmHWM:")[1].split()[0]) / 1024


def test_a_file_without_newlines_streams_in_bounded_memory(workdir) -> None:
    """200 MB in one line: read whole, it would hold the bytes and the text at once (~400 MB more)."""
    with (workdir.path / "one.txt").open("w") as handle:
        for _ in range(200):
            handle.write(("lorem ipsa dolor sit amet consectetur " * 30_000)[: 1024 * 1024])
    workdir.sources(src={"path": "one.txt", "max_doc_chars": 100_000})
    _, peak_mb = run_with_peak(workdir, "src")
    assert metrics(workdir)["documents"] == pytest.approx(200 * 1024 * 1024 / 100_000, rel=0.02)
    assert peak_mb < 500, f"ingest peaked at {peak_mb:.0f} MB"


def test_a_folder_of_100000_small_files(workdir) -> None:
    """Each file a document, named by its path, in path order; memory does not grow with the count."""
    notes = workdir.path / "notes"
    for folder in range(100):
        (notes / f"{folder:03d}").mkdir(parents=True)
        for i in range(folder * 1000, folder * 1000 + 1000):
            (notes / f"{folder:03d}" / f"{i:06d}.txt").write_text(f"Note {i}: the river and the stone.\n")
    workdir.sources(notes={"path": "notes", "include": ["**/*.txt"]})
    _, peak_mb = run_with_peak(workdir, "notes")
    parts = sorted((workdir.path / "data/raw/notes").glob("part-*.parquet"))
    table = pa.concat_tables(pq.read_table(part, columns=["id", "text"]) for part in parts)
    assert table.num_rows == metrics(workdir, "notes")["documents"] == 100_000
    ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    assert ids[0] == "notes/000/000000.txt#0" and ids[-1] == "notes/099/099999.txt#0"
    assert texts == [f"Note {i}: the river and the stone." for i in range(100_000)]
    assert peak_mb < 500, f"ingest peaked at {peak_mb:.0f} MB"


@pytest.mark.parametrize("split_by", ["paragraphs", "lines", "file", "chunks"])
def test_streamed_text_gives_the_documents_of_the_whole_text(split_by: str) -> None:
    import random

    from lmpipe.data.splitting import split_long, split_text

    rng = random.Random(split_by)
    words = ["harbour", "ship", "a", "the", "lantern", "x" * 30]
    for _ in range(30):
        pieces = []
        for _ in range(rng.randint(1, 40)):
            # `chunks` packs whole paragraphs: one of over two documents is cut as it streams in
            n = rng.choice([3, 20, 40]) if split_by == "chunks" else rng.choice([3, 40, 400, 3000])
            pieces.append(" ".join(rng.choice(words) for _ in range(n)))
            pieces.append(rng.choice(["\n", "\n\n", "\n \n", " "]))
        text = "".join(pieces)
        separators = {"paragraphs": r"\n[ \t]*\n", "lines": r"\n", "file": None, "chunks": r"\n[ \t]*\n"}
        import re

        parts = re.split(separators[split_by], text) if separators[split_by] else [text]
        if split_by == "chunks":
            from lmpipe.data.splitting import join_paragraphs

            parts = list(join_paragraphs(parts, 1000))
        whole = [doc for part in parts for doc in split_long(part, 1000)]
        cuts = sorted(rng.sample(range(1, len(text)), min(20, len(text) - 1)))
        streamed = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert list(split_text(iter(streamed), split_by, 1000)) == whole
