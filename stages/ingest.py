"""Stage `ingest@<name>`: the source `ingest.sources.<name>` -> `data/raw/<name>/part-*.parquet`
(id, source, text) and `metrics/ingest/<name>.json`.

A source is a local file or folder (`path`, which dvc.yaml declares as the stage's dependency, so DVC
hashes it and any added, removed or edited file makes the stage stale): text files (txt, jsonl, json,
parquet, csv, each optionally .gz) picked by `include`, a local Hugging Face builder (streamed, capped
at `max_documents`), a `save_to_disk` folder (Hub datasets arrive as one, from the `hub` stage), or the
unlabeled text of GLUE tasks' train splits as glue_prepare wrote them (task-adaptive pretraining,
Gururangan et al. 2020).
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stages.common import Meter, StageError, atomic_dir, log, read_json, run_main, write_json
from stages.glue import task as glue_task
from stages.layout import ingest_metrics, raw_dir
from stages.params import IngestParams, SourceParams, load_params
from stages.readers import FileReader, TextDecoder, detect_format, join_paragraphs, split_long
from stages.schemas import DOCUMENTS, validate
from stages.tracking import stage_run

# a row group is the unit of work of `clean` (resumed as a whole, on one worker): small enough to
# spread over the cores and to bound a worker's memory, large enough to keep per-shard overhead low
ROW_GROUP_DOCS = 1024
ROW_GROUP_CHARS = 16_000_000
SHARD_CHARS = 64_000_000  # characters of text per output file
SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("text", pa.string())])
Document = tuple[str, str]  # (id, text)


def _visible(path: Path, root: Path) -> bool:
    return path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)


def resolve_files(source: SourceParams, key: str) -> list[Path]:
    """The source's files: `path` itself, or the files under it that `include` matches, sorted."""
    path = Path(source.path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise StageError(f"{key}.path: '{source.path}' does not exist")
    files = sorted({f for pattern in source.include for f in path.glob(pattern) if _visible(f, path)})
    if not files:
        raise StageError(
            f"{key}.include: {', '.join(source.include)} matches no file in '{source.path}'"
        )
    return files


def file_documents(
    source: SourceParams, key: str, cfg: IngestParams, counts: Counter, meter: Meter
) -> Iterator[Document]:
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
    sizes = [path.stat().st_size for path in files]
    meter.total_bytes = sum(sizes)  # the ETA: the share of the input files' bytes read
    root = Path(source.path)
    for path, size in zip(files, sizes, strict=True):
        counts["files"] += 1
        fmt = detect_format(path, source.format)
        # ids relative to the source: the same text gives the same outputs wherever the folder lives
        name = path.name if path == root else path.relative_to(root).as_posix()
        for n, text in enumerate(reader.read(path, fmt)):
            yield f"{name}#{n}", text
        meter.update(nbytes=size)


def _texts(rows: Iterator[dict], where: str, column: str, column_key: str) -> Iterator[str | None]:
    first = True
    for row in rows:
        if first and column not in row:
            raise StageError(
                f"{where}: no text column '{column}' ({column_key}); its columns are: {', '.join(row)}"
            )
        first = False
        yield row.get(column)


def dataset_documents(source: SourceParams, key: str, counts: Counter, meter: Meter) -> Iterator[Document]:
    import datasets  # slow to import; only these sources need it

    if source.kind == "hf":
        where = f"{key} (Hugging Face builder '{source.path}')"
        try:
            data = datasets.load_dataset(
                source.path,
                source.config,
                split=source.split or "train",
                data_files=source.data_files,
                streaming=True,
            )
        except Exception as exc:  # datasets raises many types: missing, bad config, bad files
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StageError(f"{where}: cannot load: {first_line}") from None
        prefix = f"{source.path.rstrip('/')}/{source.config or 'default'}/{source.split or 'train'}"
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
    meter.total_docs = source.max_documents or getattr(data, "num_rows", None)
    n = 0
    for value in rows:
        if value is None or not isinstance(value, str):
            counts["null_texts_skipped"] += 1
            continue
        for text in split_long(value.replace("\r\n", "\n"), source.max_doc_chars):
            yield f"{prefix}#{n}", text
            n += 1
        meter.update(nbytes=len(value))
        if source.max_documents and n >= source.max_documents:
            break


def glue_manifest(source: SourceParams, key: str) -> dict:
    manifest = Path(source.path) / "manifest.json"
    if not manifest.is_file():
        raise StageError(f"{key}.path: '{source.path}' is not a folder glue_prepare wrote (no manifest.json)")
    return read_json(manifest, "glue_prepare")


def glue_documents(source: SourceParams, key: str, counts: Counter) -> Iterator[Document]:
    """Each distinct sentence of the tasks' train splits once, joined into documents of up to
    `max_doc_chars`; the labels are dropped and evaluation splits are never read."""
    prepared = glue_manifest(source, key)["rows"]
    tasks, tasks_key = (source.tasks, f"{key}.tasks") if source.tasks else (list(prepared), key)
    seen: set[str] = set()
    for i, name in enumerate(tasks):
        spec = glue_task(name, f"{tasks_key}[{i}]")
        if name not in prepared:
            raise StageError(
                f"{tasks_key}[{i}]: task '{name}' is not in '{source.path}'; it holds: {', '.join(prepared)}"
            )
        train = pq.read_table(Path(source.path) / name / "train.parquet", columns=list(spec.text_columns))
        counts["train_rows"] += train.num_rows
        sentences = []
        for column in spec.text_columns:
            for text in train.column(column).to_pylist():
                text = " ".join(str(text).split())
                if text and text not in seen:
                    seen.add(text)
                    sentences.append(text)
        counts["sentences"] += len(sentences)
        chunks = join_paragraphs(sentences, source.max_doc_chars, "\n")
        pieces = (piece for chunk in chunks for piece in split_long(chunk, source.max_doc_chars))
        for n, doc in enumerate(pieces):
            yield f"{name}/train#{n}", doc


class ShardWriter:
    """Documents into `part-<n>.parquet` files of about SHARD_CHARS characters each, in row groups of
    at most ROW_GROUP_DOCS documents and about ROW_GROUP_CHARS characters, schema-checked."""

    def __init__(self, folder: Path, label: str) -> None:
        self.folder, self.label = folder, label
        self.batch: list[Document] = []
        self.batch_chars = 0
        self.writer: pq.ParquetWriter | None = None
        self.shards = 0
        self.shard_chars = 0

    def add(self, doc_id: str, text: str) -> None:
        self.batch.append((f"{self.label}/{doc_id}", text))  # unique across sources
        self.batch_chars += len(text)
        self.shard_chars += len(text)
        if len(self.batch) >= ROW_GROUP_DOCS or self.batch_chars >= ROW_GROUP_CHARS:
            self.flush()
        if self.shard_chars >= SHARD_CHARS:
            self.close()

    def flush(self) -> None:
        if not self.batch:
            return
        path = self.folder / f"part-{self.shards:05d}.parquet"
        frame = pd.DataFrame(self.batch, columns=["id", "text"])
        frame.insert(1, "source", self.label)
        validate(DOCUMENTS, frame, str(path))
        if self.writer is None:
            self.writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self.writer.write_table(pa.Table.from_pandas(frame, schema=SCHEMA, preserve_index=False))
        self.batch.clear()
        self.batch_chars = 0

    def abandon(self) -> None:
        """Let go of the open file after a failure (its folder is discarded): nothing more is written."""
        if self.writer is not None:
            with contextlib.suppress(OSError, pa.ArrowException):  # a full disk fails the close too
                self.writer.close()
            self.writer = None

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.shards += 1
            self.shard_chars = 0


def write_source(folder: Path, label: str, docs: Iterator[Document], counts: Counter, meter: Meter) -> int:
    """The documents as shards in `folder`; returns the number of shards."""
    writer = ShardWriter(folder, label)
    try:
        for doc_id, text in docs:
            meter.update(docs=1)
            if not text.strip():
                continue
            writer.add(doc_id, text)
            counts["documents"] += 1
            counts["characters"] += len(text)
    except BaseException:
        writer.abandon()
        raise
    writer.close()
    return writer.shards


def documents(
    source: SourceParams, key: str, cfg: IngestParams, counts: Counter, meter: Meter
) -> Iterator[Document]:
    if source.kind == "files":
        return file_documents(source, key, cfg, counts, meter)
    if source.kind == "glue":
        return glue_documents(source, key, counts)
    return dataset_documents(source, key, counts, meter)


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    params = load_params()
    cfg = params.ingest
    if len(args) != 1 or args[0] not in cfg.sources:
        known = ", ".join(cfg.sources)
        raise StageError(f"usage: python -m stages.ingest <source>; the sources (ingest.sources): {known}")
    name = args[0]
    source, key = cfg.sources[name], f"ingest.sources.{name}"
    synthetic = source.synthetic or (source.kind == "glue" and glue_manifest(source, key)["synthetic"])
    with stage_run(
        "ingest",
        params.tracking.experiment,
        {"ingest": {"source": name, **source.model_dump(), "encoding_errors": cfg.encoding_errors}},
        {"data.synthetic": synthetic, "source": name},
    ) as run:
        counts: Counter = Counter()
        meter = Meter(f"ingest {name}")
        with atomic_dir(raw_dir(name)) as tmp:
            shards = write_source(tmp, name, documents(source, key, cfg, counts, meter), counts, meter)
            meter.close()
            if counts["documents"] == 0:
                raise StageError(f"{key}: no documents in '{source.path}': {dict(sorted(counts.items()))}")
            write_json(
                tmp / "manifest.json",
                {
                    "name": name,
                    "kind": source.kind,
                    "synthetic": synthetic,
                    "documents": counts["documents"],
                    "characters": counts["characters"],
                    "shards": shards,
                },
            )
        report = dict(sorted(counts.items()))
        write_json(ingest_metrics(name), report)
        run.log_metrics(report)
        log.info(
            "ingest %s: %d documents, %.1f MB in %d shard(s)",
            name,
            counts["documents"],
            counts["characters"] / 1e6,
            shards,
        )


if __name__ == "__main__":
    run_main(main)
