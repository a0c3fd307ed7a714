"""Readers that turn source files into document texts, streaming: memory stays within a few blocks
whatever the file's size (a 5 GB file without one newline becomes bounded documents as it is read).

Every reader yields (text, metadata as a JSON object) documents and counts what it could not use in
`counts` (a Counter). Text files are read as they come: WikiExtractor's output as one document per
article (lmpipe/data/wikiextractor.py), a Project Gutenberg book with its header and footer marked
(lmpipe/data/gutenberg.py), anything else split by `split_by`.
Bad input that cannot be skipped by policy raises `StageError` naming the file, line or column.
A JSON array (`.json`) is the one format read whole: it is one value; use jsonl for large files.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import re
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from lmpipe.data import gutenberg, wikiextractor
from lmpipe.data.splitting import split_long, split_text
from lmpipe.runtime import StageError, log
from lmpipe.schemas import NO_META

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
_LONE_SURROGATE = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, kept by surrogateescape
_WARN_LIMIT = 5

csv.field_size_limit(sys.maxsize)


def detect_format(path: Path, declared: str) -> str:
    if declared != "auto":
        return declared
    suffixes = path.suffixes[:-1] if path.suffix == ".gz" else path.suffixes
    return TEXT_SUFFIXES.get(suffixes[-1].lower() if suffixes else "", "txt")


BLOCK = 4 << 20  # bytes read at a time
SNIFF = 64 << 10  # the start of a file that decides whether it is empty or binary


@contextmanager
def open_binary(path: Path) -> Iterator[BinaryIO]:
    """The file's bytes as a stream (decompressed for .gz); gzip errors as one line naming the file."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            yield handle
    except EOFError:
        raise StageError(f"{path}: truncated gzip file (it ends before the end-of-stream marker)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise StageError(f"{path}: not a valid gzip file ({exc})") from None


class TextDecoder:
    """UTF-8 decoding under the `ingest.encoding_errors` policy, applied per document."""

    def __init__(self, policy: str, counts: Counter) -> None:
        self.policy = policy
        self.counts = counts

    def decode(self, chunks: Iterator[bytes], path: Path) -> Iterator[str]:
        """The text of the file's byte blocks (BOM and CRs removed), block by block; undecodable bytes
        are kept as lone surrogates for `resolve`, or fail the stage under the 'fail' policy."""
        errors = "strict" if self.policy == "fail" else "surrogateescape"
        pending, offset, lines, first, carry_cr = b"", 0, 0, True, False
        for chunk in _with_end(chunks):
            data, final = pending + (chunk or b""), chunk is None
            try:
                text, used = codecs.utf_8_decode(data, errors, final)
            except UnicodeDecodeError as exc:
                line, at = lines + data.count(b"\n", 0, exc.start) + 1, offset + exc.start
                raise StageError(
                    f"{path}:{line}: invalid UTF-8 byte 0x{data[exc.start]:02x} at offset {at} "
                    "(ingest.encoding_errors=fail; 'replace' or 'skip' would go on)"
                ) from None
            lines += data.count(b"\n", 0, used)
            offset += used
            pending = data[used:]
            if first:
                text, first = text.removeprefix("\ufeff"), False
            if carry_cr:
                text = "\r" + text
            carry_cr = text.endswith("\r") and not final  # a CRLF split between two blocks
            if carry_cr:
                text = text[:-1]
            yield text.replace("\r\n", "\n").replace("\r", "\n")

    def line(self, raw: bytes, where: str) -> str:
        """One record's bytes (a jsonl line) under the policy: lone surrogates for `resolve`."""
        try:
            return raw.decode("utf-8", "strict" if self.policy == "fail" else "surrogateescape")
        except UnicodeDecodeError as exc:
            raise StageError(
                f"{where}: invalid UTF-8 byte 0x{raw[exc.start]:02x} "
                "(ingest.encoding_errors=fail; 'replace' or 'skip' would go on)"
            ) from None

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


def _with_end(chunks: Iterator[bytes]) -> Iterator[bytes | None]:
    yield from chunks
    yield None


def _unmarked(docs: Iterator[str]) -> Iterator[tuple[str, str]]:
    """Documents whose reader knows nothing more of them."""
    return ((doc, NO_META) for doc in docs)


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

    def read(self, path: Path, fmt: str) -> Iterator[tuple[str, str]]:
        """The file's documents as (text, metadata JSON), under the encoding policy."""
        for doc, meta in self._documents_of(path, fmt):
            resolved = self.decoder.resolve(doc)
            if resolved is not None:
                yield resolved, meta

    def _documents_of(self, path: Path, fmt: str) -> Iterator[tuple[str, str]]:
        if fmt == "parquet" and path.suffix != ".gz":
            if path.stat().st_size == 0:
                self._empty(path)
                return
            with _parquet_errors(path):
                yield from _unmarked(self._parquet(path, pq.ParquetFile(path)))
            return
        with open_binary(path) as handle:
            first = handle.read(SNIFF)
            if not first.strip() and len(first) < SNIFF:
                self._empty(path)
                return
            if fmt == "parquet":  # a compressed parquet file: its footer is at the end, so read it whole
                with _parquet_errors(path):
                    whole = pq.ParquetFile(pa.BufferReader(first + handle.read()))
                    yield from _unmarked(self._parquet(path, whole))
                return
            if b"\x00" in first:
                self.counts["binary_files_skipped"] += 1
                log.warning("%s: binary file (NUL bytes), skipped", path)
                return
            stream = io.BufferedReader(_Prepended(first, handle), BLOCK)  # the sniffed bytes first
            if fmt == "jsonl":
                yield from _unmarked(self._jsonl(path, stream))
                return
            texts = self.decoder.decode(iter(lambda: stream.read(BLOCK), b""), path)
            if fmt == "txt" and wikiextractor.is_extract(first):
                self.counts["wikiextractor_files"] += 1
                yield from self._articles(texts)
            elif fmt == "txt" and gutenberg.is_book(first):
                self.counts["gutenberg_files"] += 1
                yield from self._book(texts)
            elif fmt == "txt":
                yield from _unmarked(split_text(texts, self.split_by, self.max_chars))
            elif fmt == "json":
                yield from _unmarked(self._json(path, "".join(texts)))
            else:
                yield from _unmarked(self._csv(path, texts))

    def _articles(self, texts: Iterator[str]) -> Iterator[tuple[str, str]]:
        """WikiExtractor's articles, each one document (cut only when longer than max_doc_chars)."""
        for meta, lines in wikiextractor.articles(_lines(texts), self.counts):
            for doc in split_text(lines, "file", self.max_chars):
                yield doc, meta

    def _book(self, texts: Iterator[str]) -> Iterator[tuple[str, str]]:
        """A Project Gutenberg book split by `split_by` within its header, body and footer (no document
        spans two); the header's and footer's documents marked for clean's gutenberg_boilerplate."""
        for part, pieces in groupby(gutenberg.parts(texts), key=itemgetter(0)):
            meta = NO_META if part == "body" else json.dumps({"gutenberg": part})
            for doc in split_text((text for _, text in pieces), self.split_by, self.max_chars):
                yield doc, meta

    def _empty(self, path: Path) -> None:
        self.counts["empty_files"] += 1
        log.warning("%s: empty file, skipped", path)

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

    def _jsonl(self, path: Path, lines: BinaryIO) -> Iterator[str]:
        start = True
        for lineno, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            raw = (raw.removeprefix(b"\xef\xbb\xbf") if lineno == 1 else raw).rstrip(b"\r\n")
            line = self.decoder.line(raw, f"{path}:{lineno}")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                self._malformed(f"{path}:{lineno}", f"malformed JSON line ({exc.msg}, column {exc.colno})")
                continue
            value = self._record_text(record, f"{path}:{lineno}", path, start)
            start = False
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

    def _csv(self, path: Path, texts: Iterator[str]) -> Iterator[str]:
        # strict: a quote that never closes is an error, not the rest of the file read as one field
        reader = csv.DictReader(_lines(texts), strict=True)
        try:
            header = list(reader.fieldnames or [])
        except csv.Error as exc:
            raise StageError(f"{path}:1: malformed CSV header ({exc})") from None
        if self.text_column not in header:
            raise _missing_column(path, self.text_column, header, self.column_key)
        rows = iter(reader)
        while True:
            start = reader.line_num + 1  # where the row begins: a quoted field may span lines
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                self._malformed(f"{path}:{start}", f"malformed CSV row ({exc})")
                continue
            value = row.get(self.text_column)
            if value is None or None in row or None in row.values():
                self._malformed(f"{path}:{start}", "row has a different number of fields than the header")
                continue
            yield from self._documents(value)

    def _parquet(self, path: Path, table_file: pq.ParquetFile) -> Iterator[str]:
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


@contextmanager
def _parquet_errors(path: Path) -> Iterator[None]:
    """pyarrow's errors on a file that is not Parquet, or a damaged one, as one line naming it."""
    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        raise StageError(f"{path}: not a readable Parquet file ({first_line(exc)})") from None


def first_line(exc: Exception) -> str:
    """An exception's message in one line (its first), for an error line naming the file."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Prepended(io.RawIOBase):
    """A binary stream whose first bytes were read already (to sniff the file)."""

    def __init__(self, first: bytes, rest: BinaryIO) -> None:
        self.first, self.rest = first, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        if self.first:
            n = min(len(buffer), len(self.first))
            buffer[:n], self.first = self.first[:n], self.first[n:]
            return n
        data = self.rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _lines(texts: Iterator[str]) -> Iterator[str]:
    """Lines (with their newline) of a text that arrives in pieces, for csv."""
    buffer = ""
    for text in texts:
        buffer += text
        *complete, buffer = buffer.split("\n")
        for line in complete:
            yield line + "\n"
    if buffer:
        yield buffer
