"""Readers that turn source files into document texts.

Every reader yields plain `str` documents and counts what it could not use in `counts` (a Counter).
Bad input that cannot be skipped by policy raises `StageError` naming the file, line or column.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stages.common import StageError, log

TEXT_SUFFIXES = {
    ".txt": "txt",
    ".text": "txt",
    ".md": "txt",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}
_BLANK_LINES = re.compile(r"\n[ \t]*\n")
_LONE_SURROGATE = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, kept by surrogateescape
_WARN_LIMIT = 5

csv.field_size_limit(sys.maxsize)


def detect_format(path: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    suffixes = path.suffixes[:-1] if path.suffix == ".gz" else path.suffixes
    return TEXT_SUFFIXES.get(suffixes[-1].lower() if suffixes else "", "txt")


def read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if path.suffix != ".gz":
        return raw
    try:
        return gzip.decompress(raw)
    except EOFError:
        raise StageError(f"{path}: truncated gzip file (it ends before the end-of-stream marker)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise StageError(f"{path}: not a valid gzip file ({exc})") from None


class TextDecoder:
    """UTF-8 decoding under the `ingest.encoding_errors` policy, applied per document."""

    def __init__(self, policy: str, counts: Counter) -> None:
        self.policy = policy
        self.counts = counts

    def decode(self, data: bytes, path: Path) -> tuple[str, bool]:
        """Text of the file (BOM stripped) and whether it holds invalid bytes to resolve per document."""
        try:
            text, dirty = data.decode("utf-8"), False
        except UnicodeDecodeError as exc:
            if self.policy == "fail":
                line = data.count(b"\n", 0, exc.start) + 1
                raise StageError(
                    f"{path}:{line}: invalid UTF-8 byte 0x{data[exc.start]:02x} at offset {exc.start} "
                    "(ingest.encoding_errors=fail; 'replace' or 'skip' would go on)"
                ) from None
            text, dirty = data.decode("utf-8", errors="surrogateescape"), True
        return text.removeprefix("\ufeff"), dirty

    def resolve(self, doc: str) -> str | None:
        """Apply the policy to one document that may hold undecodable bytes."""
        bad = len(_LONE_SURROGATE.findall(doc))
        if not bad:
            return doc
        if self.policy == "skip":
            self.counts["invalid_utf8_documents_skipped"] += 1
            return None
        self.counts["invalid_utf8_bytes_replaced"] += bad
        return _LONE_SURROGATE.sub("\ufffd", doc)


def split_long(doc: str, max_chars: int) -> Iterator[str]:
    """Cut a document longer than `max_chars` at whitespace (hard cut if a piece has none)."""
    start, n = 0, len(doc)
    while n - start > max_chars:
        cut = doc.rfind(" ", start + max_chars // 2, start + max_chars)
        cut = max(cut, doc.rfind("\n", start + max_chars // 2, start + max_chars))
        end = cut if cut > start else start + max_chars
        piece = doc[start:end].strip()
        if piece:
            yield piece
        start = end
    piece = doc[start:].strip()
    if piece:
        yield piece


def split_text(text: str, split_by: str, max_chars: int) -> Iterator[str]:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if split_by == "file":
        parts: list[str] = [text]
    elif split_by == "lines":
        parts = text.split("\n")
    else:
        parts = _BLANK_LINES.split(text)
    if split_by == "chunks":
        parts = list(join_paragraphs(parts, max_chars))
    for part in parts:
        yield from split_long(part, max_chars)


def join_paragraphs(paragraphs: list[str], max_chars: int, separator: str = "\n\n") -> Iterator[str]:
    """Consecutive paragraphs joined into chunks of up to `max_chars` (a longer paragraph stays whole)."""
    chunk: list[str] = []
    size = 0
    for para in paragraphs:
        para = para.strip()
        if not para:
            continue
        if chunk and size + len(para) + len(separator) > max_chars:
            yield separator.join(chunk)
            chunk, size = [], 0
        chunk.append(para)
        size += len(para) + len(separator)
    if chunk:
        yield separator.join(chunk)


def _missing_column(path: Path, column: str, columns: list[str], key: str) -> StageError:
    listed = ", ".join(map(str, columns)) or "(none)"
    return StageError(f"{path}: no text column '{column}' ({key}); its columns are: {listed}")


class FileReader:
    """Documents of one local file, by format."""

    def __init__(
        self,
        decoder: TextDecoder,
        counts: Counter,
        on_malformed: str,
        text_column: str,
        column_key: str,
        split_by: str,
        max_chars: int,
    ) -> None:
        self.decoder = decoder
        self.counts = counts
        self.on_malformed = on_malformed
        self.text_column = text_column
        self.column_key = column_key
        self.split_by = split_by
        self.max_chars = max_chars

    def read(self, path: Path, fmt: str) -> Iterator[str]:
        data = read_bytes(path)
        if not data.strip():
            self.counts["empty_files"] += 1
            log.warning("%s: empty file, skipped", path)
            return
        if fmt == "parquet":
            yield from self._parquet(path, data)
            return
        if b"\x00" in data:
            self.counts["binary_files_skipped"] += 1
            log.warning("%s: binary file (NUL bytes), skipped", path)
            return
        text, dirty = self.decoder.decode(data, path)
        if fmt == "txt":
            docs: Iterator[str] = split_text(text, self.split_by, self.max_chars)
        elif fmt == "jsonl":
            docs, dirty = self._jsonl(path, text), True
        elif fmt == "json":
            docs, dirty = self._json(path, text), True
        else:
            docs = self._csv(path, text)
        for doc in docs:
            resolved = self.decoder.resolve(doc) if dirty else doc
            if resolved is not None:
                yield resolved

    def _malformed(self, where: str, why: str) -> None:
        if self.on_malformed == "fail":
            raise StageError(f"{where}: {why} (ingest.on_malformed=fail; 'skip' would count and go on)")
        self.counts["malformed_records_skipped"] += 1
        if self.counts["malformed_records_skipped"] <= _WARN_LIMIT:
            log.warning("%s: %s, skipped", where, why)

    def _record_text(self, record: object, where: str, path: Path, first: bool) -> str | None:
        if not isinstance(record, dict):
            self._malformed(where, f"expected a JSON object, got {type(record).__name__}")
            return None
        if self.text_column not in record:
            if first:
                raise _missing_column(path, self.text_column, list(record), self.column_key)
            self._malformed(where, f"no '{self.text_column}' field")
            return None
        value = record[self.text_column]
        if value is None:
            self.counts["null_texts_skipped"] += 1
            return None
        if not isinstance(value, str):
            self._malformed(where, f"'{self.text_column}' is a {type(value).__name__}, not a string")
            return None
        return value

    def _documents(self, text: str) -> Iterator[str]:
        # a record is one document; only over-long ones are cut
        yield from split_long(text.replace("\r\n", "\n"), self.max_chars)

    def _jsonl(self, path: Path, text: str) -> Iterator[str]:
        first = True
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                self._malformed(f"{path}:{lineno}", f"malformed JSON line ({exc.msg}, column {exc.colno})")
                continue
            value = self._record_text(record, f"{path}:{lineno}", path, first)
            first = False
            if value is not None:
                yield from self._documents(value)

    def _json(self, path: Path, text: str) -> Iterator[str]:
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StageError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(records, list):
            raise StageError(f"{path}: expected a JSON array of objects, got {type(records).__name__}")
        for index, record in enumerate(records):
            value = self._record_text(record, f"{path}[{index}]", path, index == 0)
            if value is not None:
                yield from self._documents(value)

    def _csv(self, path: Path, text: str) -> Iterator[str]:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if self.text_column not in (reader.fieldnames or []):
            raise _missing_column(path, self.text_column, list(reader.fieldnames or []), self.column_key)
        for row in reader:
            value = row.get(self.text_column)
            if value is None or None in row:
                self._malformed(
                    f"{path}:{reader.line_num}", "row has a different number of fields than the header"
                )
                continue
            yield from self._documents(value)

    def _parquet(self, path: Path, data: bytes) -> Iterator[str]:
        try:
            table_file = pq.ParquetFile(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            raise StageError(f"{path}: not a readable parquet file ({exc})") from None
        columns = table_file.schema_arrow.names
        if self.text_column not in columns:
            raise _missing_column(path, self.text_column, columns, self.column_key)
        for batch in table_file.iter_batches(columns=[self.text_column]):
            values = batch.column(0)
            if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
                raise StageError(f"{path}: column '{self.text_column}' holds {values.type}, not text")
            for value in values.to_pylist():
                if value is None:
                    self.counts["null_texts_skipped"] += 1
                else:
                    yield from self._documents(value)
