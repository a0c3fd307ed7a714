"""What stage `ingest@<source>` is made of: a source's files, datasets or GLUE text read as
documents, with their drops counted.

A folder's files are read in units of consecutive files (a task for a worker, and an output part of
its own). Each file's documents are kept in a store (lmpipe/data/store.py) keyed by its name and
bytes, and each unit's parts by its files' keys: a new, changed or removed file is the only one read
again, its unit's parts are assembled again from the kept files, and every other unit's parts are the
kept ones. Where a unit ends depends on its files' names and sizes (a name's hash picks the ends, past
a minimum size), so an added file moves the ends of its own unit only."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lmpipe.data.parallel import map_unless_kept
from lmpipe.data.progress import Meter
from lmpipe.data.readers import FileReader, TextDecoder, detect_format, first_line
from lmpipe.data.splitting import join_paragraphs, split_long
from lmpipe.data.store import StatMemo, Store, digest, link
from lmpipe.glue.tasks import task as glue_task
from lmpipe.layout import ingest_store
from lmpipe.params.ingest import IngestParams, SourceParams
from lmpipe.runtime import (
    StageError,
    cpu_threads,
    log,
    read_json,
    setup_logging,
    sha256_file,
)
from lmpipe.schemas import DOCUMENT_COLUMNS, DOCUMENTS, DOCUMENTS_ARROW, NO_META, validate

# a row group is the unit of work of `clean` (resumed as a whole, on one worker): small enough to
# spread over the cores and to bound a worker's memory, large enough to keep per-shard overhead low
ROW_GROUP_DOCS = 1024


ROW_GROUP_CHARS = 16_000_000


SHARD_CHARS = 64_000_000  # characters of text per output file


# a row group ends with a file of at least this many characters, and after a smaller file whose name
# draws an end once it holds as many: a file added to a folder of books changes its own row group only
# (and clean judges, pack encodes, that shard only)
FILE_GROUP_CHARS = 512_000


UNIT_BYTES = 64 << 20  # input bytes a unit of work reaches at most (one file larger is a unit alone)


# a unit of at least UNIT_MIN_BYTES ends after a file whose name hashes to 0 mod UNIT_ENDS: units of
# about 6 MB of 1 MB files (2 MB and four files more), so that an added file costs clean and pack a
# shard or two
UNIT_MIN_BYTES = 2 << 20


UNIT_ENDS = 4


UNIT_LOG_S = 30.0  # a unit still running after this long logs its progress (one large file)


Document = tuple[str, str, str]  # (id, text, metadata as a JSON object)


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
        raise StageError(f"{key}.include: {', '.join(source.include)} matches no file in '{source.path}'")
    return files


@dataclass(frozen=True)
class Unit:
    """Consecutive files of a source: read by one worker into parts of its own, finished whole or not
    at all. A file is never split, so one very large file is one unit."""

    index: int
    files: tuple[tuple[str, str], ...]  # (path as the source gives it, its name in the documents' ids)
    nbytes: int
    keys: tuple[str, ...]  # each file's: its name and the sha256 of its bytes

    def key(self) -> str:
        """Its entry's key in the store: its files' keys."""
        return digest("unit", list(self.keys))


def ends_a_unit(name: str) -> bool:
    """Whether a unit may end after the file of this name: a draw from the name alone, so the ends
    before and after an added file stay where they were."""
    return hashlib.blake2b(name.encode(), digest_size=8).digest()[0] % UNIT_ENDS == 0


def units_of(files: list[Path], root: Path, memo: StatMemo | None = None) -> list[Unit]:
    """The files in order, grouped into units of up to UNIT_BYTES of input: a unit ends at that size,
    or after a file whose name `ends_a_unit` once it holds UNIT_MIN_BYTES. A file's sha256 is taken
    from `memo` (the store's) while its stat has not moved."""
    units: list[Unit] = []
    batch: list[tuple[str, str]] = []
    keys: list[str] = []
    size = 0
    for i, path in enumerate(files):
        # ids relative to the source: the same text gives the same outputs wherever the folder lives
        name = path.name if path == root else path.relative_to(root).as_posix()
        batch.append((str(path), name))
        keys.append(digest("file", name, memo.get(path, sha256_file) if memo else sha256_file(path)))
        size += path.stat().st_size
        full = size >= UNIT_BYTES or (size >= UNIT_MIN_BYTES and ends_a_unit(name))
        if full or i == len(files) - 1:
            units.append(Unit(len(units), tuple(batch), size, tuple(keys)))
            batch, keys, size = [], [], 0
    return units


@dataclass(frozen=True)
class Job:
    """What every unit of one run shares (sent to each worker)."""

    name: str  # the source's: the documents' `source` and the prefix of their ids
    key: str  # its params key, for error lines
    source: SourceParams
    encoding_errors: str
    on_malformed: str
    store: Store  # the files' documents and the units' parts by digest
    project: str  # the stage's folder, where a relative source path starts

    def local(self, path: str) -> Path:
        """The path here; a relative one as given (so errors name it so), unless this worker runs
        elsewhere (a cluster's)."""
        if Path(path).is_absolute() or Path.cwd() == Path(self.project):
            return Path(path)
        return Path(self.project) / path


FILES = "files.json"  # in a unit's entry: each file's key -> [its first row, its rows, its counts]


def ingest_unit(job: Job, unit: Unit) -> dict:
    """A unit's documents as parts in its store entry, written whole; a file that an earlier run read
    (into another unit's entry, which the store keeps) is copied from there, not read again. Its
    counts, the files it read and the entries it used."""
    here = Path.cwd() == Path(job.project)
    paths = [Path(given) if here else job.local(given) for given, _ in unit.files]
    file_keys, unit_key = unit.keys, unit.key()
    used = {"keys": [unit_key], "files_read": 0}
    kept = job.store.get(unit_key)
    if kept is not None:  # every file as an earlier run read it
        return {"counts": json.loads((kept / "counts.json").read_text()), **used}
    setup_logging()  # a pool's worker process: the readers' warnings in the stage's format
    # a unit can be one very large file: its worker logs how far it is, as the stage does per unit
    # (characters for bytes: close enough for an ETA, but not against a compressed file's size)
    compressed = any(given.endswith(".gz") for given, _ in unit.files)
    total = None if compressed else unit.nbytes
    meter = Meter(f"ingest {job.name}, unit {unit.index + 1}", None, total, UNIT_LOG_S, terminal=False)
    earlier = kept_files(job.store, set(file_keys))
    counts: Counter = Counter()
    files: dict[str, list] = {}
    rows_before = 0
    with job.store.put(unit_key) as tmp:
        writer = ShardWriter(tmp, job.name)
        try:
            for path, (_, name), key in zip(paths, unit.files, file_keys, strict=True):
                if key in earlier:
                    entry, first, rows, file_counts = earlier[key]
                    writer.add_rows(kept_rows(entry, first, rows))
                else:
                    file_counts = Counter()
                    docs = read_documents(job, path, name, file_counts, meter)
                    add_documents(writer, docs, file_counts)
                    used["files_read"] += 1
                writer.end_file(name, file_counts["characters"])
                files[key] = [rows_before, file_counts["documents"], file_counts]
                rows_before += file_counts["documents"]
                counts.update(file_counts)
        except BaseException:
            writer.abandon()
            raise
        writer.close()
        (tmp / "counts.json").write_text(json.dumps(counts))
        (tmp / FILES).write_text(json.dumps(files))
    return {"counts": dict(counts), **used}


def kept_files(store: Store, wanted: set[str]) -> dict[str, tuple[Path, int, int, dict]]:
    """Where the store keeps the documents of the wanted files (an earlier run's units hold them):
    file key -> (the unit's entry, the file's first row in it, its rows, its counts)."""
    found: dict[str, tuple[Path, int, int, dict]] = {}
    for folder in sorted((store.root / "entries").iterdir()):
        files = folder / FILES
        if folder.name.startswith(".") or not files.is_file():
            continue
        try:
            listed = json.loads(files.read_text())
        except (OSError, ValueError):
            continue  # a damaged entry: its files are read again
        hits = wanted.intersection(listed).difference(found)
        if hits and store.get(folder.name) is not None:
            found |= {key: (folder, *listed[key]) for key in hits}
    return found


def new_bytes(job: Job, units: list[Unit]) -> int:
    """The size of the units' files that no earlier run read (the others are copied from the store)."""
    earlier = kept_files(job.store, {key for unit in units for key in unit.keys})
    return sum(
        Path(given).stat().st_size
        for unit in units
        for (given, _), key in zip(unit.files, unit.keys, strict=True)
        if key not in earlier
    )


def kept_rows(entry: Path, first: int, rows: int) -> Iterator[tuple[str, str, str, str]]:
    """Rows first .. first + rows of a unit's parts, in order, a row group at a time."""
    at, end = 0, first + rows
    for part in sorted(entry.glob("part-*.parquet")):
        with pq.ParquetFile(part) as table_file:
            for group in range(table_file.num_row_groups):
                n = table_file.metadata.row_group(group).num_rows
                if at < end and at + n > first:
                    table = table_file.read_row_group(group, columns=DOCUMENT_COLUMNS)
                    table = table.slice(max(first - at, 0), min(end, at + n) - max(first, at))
                    yield from zip(*(table.column(c).to_pylist() for c in DOCUMENT_COLUMNS), strict=True)
                at += n


def read_documents(job: Job, path: Path, name: str, counts: Counter, meter: Meter) -> Iterator[Document]:
    """One file's documents, its reads and drops counted."""
    source = job.source
    reader = FileReader(
        TextDecoder(job.encoding_errors, counts),
        counts,
        job.on_malformed,
        source.text_column,
        f"{job.key}.text_column",
        source.split_by,
        source.max_doc_chars,
    )
    counts["files"] += 1
    for n, (text, meta) in enumerate(reader.read(path, detect_format(path, source.format))):
        meter.update(docs=1, nbytes=len(text))
        yield f"{name}#{n}", text, meta


def ingest_files(
    job: Job, files: list[Path], workers: int, scheduler: str | None, out: Path, counts: Counter
) -> int:
    """Every unit of the files (in this process, on a process per core, or on a Dask cluster) as parts
    in the store, each file read only when the store lacks it, then the units' parts linked into `out`
    in order; returns the number of parts."""
    memo = StatMemo(job.store, "file-digests.json")
    units = units_of(files, Path(job.source.path), memo)
    memo.save()
    meter = Meter(f"ingest {job.name}", total_bytes=sum(u.nbytes for u in units))
    kept = [job.store.path(unit.key()).is_dir() for unit in units]
    if (
        not scheduler
        and new_bytes(job, [u for u, done in zip(units, kept, strict=True) if not done]) < UNIT_BYTES
    ):
        workers = 1  # starting worker processes takes longer than reading a few new files (a book) here
    read_units = partial(ingest_unit, job)
    results = map_unless_kept(read_units, units, kept, workers, scheduler, f"ingest@{job.name}")
    parts, read, used = 0, 0, []
    for unit, result in zip(units, results, strict=True):
        counts.update(result["counts"])
        read += result["files_read"]
        used += result["keys"]
        meter.update(docs=result["counts"].get("documents", 0), nbytes=unit.nbytes)
        for part in sorted(job.store.path(used[-1]).glob("part-*.parquet")):
            link(part, out / f"part-{parts:05d}.parquet")
            parts += 1
    meter.close()
    if read < len(files):
        log.info(
            "ingest %s: read %d of %d files; the others as an earlier run read them",
            job.name,
            read,
            len(files),
        )
    job.store.keep_only(used)  # what a rerun on these files needs stays
    return parts


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
            raise StageError(f"{where}: cannot load: {first_line(exc)}") from None
        prefix = f"{source.path.rstrip('/')}/{source.config or 'default'}/{source.split or 'train'}"
    else:
        where = f"{key}.path '{source.path}'"
        try:
            data = datasets.load_from_disk(source.path)
        except FileNotFoundError:
            raise StageError(f"{where}: not a datasets save_to_disk folder") from None
        except Exception as exc:  # a damaged folder: its JSON or Arrow files fail in many ways
            reason = first_line(exc)
            raise StageError(f"{where}: not a readable datasets save_to_disk folder ({reason})") from None
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
    try:
        for value in rows:
            if value is None or not isinstance(value, str):
                counts["null_texts_skipped"] += 1
                continue
            for text in split_long(value.replace("\r\n", "\n"), source.max_doc_chars):
                yield f"{prefix}#{n}", text, NO_META
                n += 1
            meter.update(nbytes=len(value))
            if source.max_documents and n >= source.max_documents:
                break
    except (pa.ArrowException, OSError) as exc:  # Arrow files damaged past their header
        raise StageError(f"{where}: unreadable rows ({first_line(exc)})") from None


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
            yield f"{name}/train#{n}", doc, NO_META


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

    def add(self, doc_id: str, text: str, meta: str) -> None:
        self.add_rows([(f"{self.label}/{doc_id}", self.label, text, meta)])  # ids unique across sources

    def add_rows(self, rows: Iterable[tuple[str, str, str, str]]) -> None:
        """Whole rows (id, source, text, meta), as a kept file's parts hold them."""
        for row in rows:
            self.batch.append(row)
            self.batch_chars += len(row[2])
            self.shard_chars += len(row[2])
            if len(self.batch) >= ROW_GROUP_DOCS or self.batch_chars >= ROW_GROUP_CHARS:
                self.flush()
            if self.shard_chars >= SHARD_CHARS:
                self.close()

    def end_file(self, name: str, characters: int) -> None:
        """Where a file's documents end: the row group ends here if the file is a large one, or if it
        holds FILE_GROUP_CHARS and the file's name draws an end (`ends_a_unit`)."""
        if characters >= FILE_GROUP_CHARS or (self.batch_chars >= FILE_GROUP_CHARS and ends_a_unit(name)):
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        path = self.folder / f"part-{self.shards:05d}.parquet"
        frame = pd.DataFrame(self.batch, columns=DOCUMENT_COLUMNS)
        validate(DOCUMENTS, frame, str(path))
        if self.writer is None:
            self.writer = pq.ParquetWriter(path, DOCUMENTS_ARROW, compression="zstd")
        self.writer.write_table(pa.Table.from_pandas(frame, schema=DOCUMENTS_ARROW, preserve_index=False))
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


def add_documents(
    writer: ShardWriter, docs: Iterator[Document], counts: Counter, meter: Meter | None = None
) -> None:
    """The documents that hold more than whitespace, into the writer, counted."""
    for doc_id, text, meta in docs:
        if meter is not None:
            meter.update(docs=1)
        if not text.strip():
            continue
        writer.add(doc_id, text, meta)
        counts["documents"] += 1
        counts["characters"] += len(text)


def write_source(
    folder: Path, label: str, docs: Iterator[Document], counts: Counter, meter: Meter | None = None
) -> int:
    """The documents as shards in `folder`; returns the number of shards."""
    writer = ShardWriter(folder, label)
    try:
        add_documents(writer, docs, counts, meter)
    except BaseException:
        writer.abandon()
        raise
    writer.close()
    return writer.shards


def ingest(name: str, cfg: IngestParams, scheduler: str | None, out: Path, counts: Counter) -> int:
    """The source's documents as parts in `out`; returns the number of parts. Files are read in units
    (on every core or a Dask cluster, resumed after an interruption); a dataset or GLUE source is one
    stream, read here."""
    source, key = cfg.sources[name], f"ingest.sources.{name}"
    if source.kind == "files":
        # the params that shape a file's documents: not where the folder is, nor which files it reads
        config = {
            key: source.model_dump(exclude={"path", "include"}),
            "ingest.encoding_errors": cfg.encoding_errors,
            "ingest.on_malformed": cfg.on_malformed,
        }
        store = Store(ingest_store(name), f"ingest {name}", config, "stages.ingest").open()
        job = Job(name, key, source, cfg.encoding_errors, cfg.on_malformed, store, str(Path.cwd()))
        workers = cpu_threads(cfg.workers)
        return ingest_files(job, resolve_files(source, key), workers, scheduler, out, counts)
    meter = Meter(f"ingest {name}")
    if source.kind == "glue":
        docs = glue_documents(source, key, counts)
    else:
        docs = dataset_documents(source, key, counts, meter)
    parts = write_source(out, name, docs, counts, meter)
    meter.close()
    return parts
