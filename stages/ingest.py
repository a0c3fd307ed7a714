"""Stage `ingest`: the sources in `ingest.sources` -> `data/raw/<nn>-<name>.parquet` (id, source, text).

Sources are local files and globs (txt, jsonl, json, parquet, csv, each optionally .gz), a Hugging Face
dataset by name/config/split (streamed, capped at `max_documents`), a `save_to_disk` folder, or the
unlabeled text of GLUE tasks' train splits (task-adaptive pretraining, Gururangan et al. 2020).
"""

from __future__ import annotations

import glob
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stages.common import StageError, atomic_dir, log, progress, run_main, write_json
from stages.glue import task as glue_task
from stages.glue_prepare import read_task
from stages.layout import INGEST_METRICS, RAW
from stages.params import GlueParams, IngestParams, SourceParams, load_params
from stages.readers import FileReader, TextDecoder, detect_format, join_paragraphs, split_long
from stages.schemas import DOCUMENTS, validate
from stages.tracking import stage_run

BATCH_ROWS = 8192
Document = tuple[str, str]  # (id, text)


def resolve_files(source: SourceParams, key: str) -> list[Path]:
    pattern = source.path or ""
    if glob.has_magic(pattern):
        files = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not files:
            raise StageError(f"{key}.path: '{pattern}' matches no file")
        return files
    path = Path(pattern)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise StageError(f"{key}.path: directory '{pattern}' holds no file")
        return files
    if not path.exists():
        raise StageError(f"{key}.path: '{pattern}' does not exist")
    return [path]


def file_documents(source: SourceParams, key: str, cfg: IngestParams, counts: Counter) -> Iterator[Document]:
    reader = FileReader(
        TextDecoder(cfg.encoding_errors, counts),
        counts,
        cfg.on_malformed,
        source.text_column,
        f"{key}.text_column",
        source.split_by,
        source.max_doc_chars,
    )
    files = resolve_files(source, key)
    for path in progress(files, desc=f"ingest {source.label}", unit="file"):
        counts["files"] += 1
        fmt = detect_format(path, source.format)
        for n, text in enumerate(reader.read(path, fmt)):
            yield f"{path.as_posix()}#{n}", text


def _texts(rows: Iterator[dict], where: str, column: str, column_key: str) -> Iterator[str | None]:
    first = True
    for row in rows:
        if first and column not in row:
            raise StageError(
                f"{where}: no text column '{column}' ({column_key}); its columns are: {', '.join(row)}"
            )
        first = False
        yield row.get(column)


def dataset_documents(source: SourceParams, key: str, counts: Counter) -> Iterator[Document]:
    import datasets  # slow to import; only these sources need it

    if source.kind == "hf":
        where = f"{key} (Hugging Face dataset '{source.dataset}')"
        try:
            data = datasets.load_dataset(
                source.dataset,
                source.config,
                split=source.split or "train",
                data_files=source.data_files,
                streaming=True,
            )
        except Exception as exc:  # datasets raises many types: missing, offline, bad config
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StageError(f"{where}: cannot load: {first_line}") from None
        prefix = f"{source.dataset}/{source.config or 'default'}/{source.split or 'train'}"
    else:
        where = f"{key}.path '{source.path}'"
        try:
            data = datasets.load_from_disk(source.path)
        except FileNotFoundError:
            raise StageError(f"{where}: not a datasets save_to_disk folder") from None
        if isinstance(data, datasets.DatasetDict):
            split = source.split or ("train" if "train" in data else None)
            if split not in data:
                raise StageError(
                    f"{key}.split: '{source.split}' is not in {source.path}; "
                    f"its splits are: {', '.join(data)}"
                )
            data = data[split]
        if source.text_column not in data.column_names:
            raise StageError(
                f"{where}: no text column '{source.text_column}' ({key}.text_column); "
                f"its columns are: {', '.join(data.column_names)}"
            )
        prefix = source.path.rstrip("/")
    rows = _texts(iter(data), where, source.text_column, f"{key}.text_column")
    n = 0
    for value in progress(rows, desc=f"ingest {source.label}", unit="doc", total=source.max_documents):
        if value is None or not isinstance(value, str):
            counts["null_texts_skipped"] += 1
            continue
        for text in split_long(value.replace("\r\n", "\n"), source.max_doc_chars):
            yield f"{prefix}#{n}", text
            n += 1
        if source.max_documents and n >= source.max_documents:
            break


def glue_documents(source: SourceParams, key: str, glue: GlueParams, counts: Counter) -> Iterator[Document]:
    """Each distinct sentence of the tasks' train splits once, joined into documents of up to
    `max_doc_chars`; the labels are dropped and evaluation splits are never read."""
    tasks, tasks_key = (source.tasks, f"{key}.tasks") if source.tasks else (glue.tasks, "glue.tasks")
    seen: set[str] = set()
    for i, name in enumerate(tasks):
        spec = glue_task(name, f"{tasks_key}[{i}]")
        train = read_task(glue, spec, ["train"])["train"]
        counts["train_rows"] += len(train)
        sentences = []
        for column in spec.text_columns:
            for text in train[column]:
                text = " ".join(str(text).split())
                if text and text not in seen:
                    seen.add(text)
                    sentences.append(text)
        counts["sentences"] += len(sentences)
        chunks = join_paragraphs(sentences, source.max_doc_chars, "\n")
        pieces = (piece for chunk in chunks for piece in split_long(chunk, source.max_doc_chars))
        for n, doc in enumerate(pieces):
            yield f"glue/{name}/train#{n}", doc


def write_source(path: Path, label: str, docs: Iterator[Document], counts: Counter) -> None:
    schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        batch: list[Document] = []

        def flush() -> None:
            frame = pd.DataFrame(batch, columns=["id", "text"])
            frame.insert(1, "source", label)
            validate(DOCUMENTS, frame, str(path))
            writer.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False))
            batch.clear()

        for doc_id, text in docs:
            if not text.strip():
                continue
            batch.append((doc_id, text))
            counts["documents"] += 1
            counts["characters"] += len(text)
            if len(batch) >= BATCH_ROWS:
                flush()
        if batch:
            flush()


def main() -> None:
    params = load_params()
    cfg = params.ingest
    synthetic = [s.synthetic or (s.kind == "glue" and params.glue.synthetic) for s in cfg.sources]
    any_synthetic = any(synthetic)
    with stage_run(
        "ingest", params.tracking.experiment, {"ingest": cfg.model_dump()}, {"data.synthetic": any_synthetic}
    ) as run:
        report: dict[str, dict[str, int]] = {}
        manifest = []
        with atomic_dir(RAW) as tmp:
            for i, source in enumerate(cfg.sources):
                key = f"ingest.sources[{i}]"
                counts: Counter = Counter()
                if source.kind == "files":
                    docs = file_documents(source, key, cfg, counts)
                elif source.kind == "glue":
                    docs = glue_documents(source, key, params.glue, counts)
                else:
                    docs = dataset_documents(source, key, counts)
                write_source(tmp / f"{i:02d}-{source.label}.parquet", source.label, docs, counts)
                if counts["documents"] == 0:
                    log.warning("%s (%s): no documents", key, source.label)
                report[source.label] = dict(sorted(counts.items()))
                manifest.append(
                    {
                        "name": source.label,
                        "kind": source.kind,
                        "synthetic": synthetic[i],
                        "documents": counts["documents"],
                        "characters": counts["characters"],
                    }
                )
            total = sum(c.get("documents", 0) for c in report.values())
            if total == 0:
                raise StageError(f"ingest: no documents in any source: {report}")
            write_json(tmp / "manifest.json", {"synthetic": any_synthetic, "sources": manifest})
        totals: Counter = Counter()
        for counts_of_source in report.values():
            totals.update(counts_of_source)
        write_json(INGEST_METRICS, {"total": dict(sorted(totals.items())), "sources": report})
        run.log_metrics({"total": dict(totals)})
        log.info(
            "ingest: %d documents, %.1f MB from %d sources",
            totals["documents"],
            totals["characters"] / 1e6,
            len(cfg.sources),
        )


if __name__ == "__main__":
    run_main(main)
