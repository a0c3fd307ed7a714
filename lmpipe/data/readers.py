"""Readers that turn source files into document texts, streaming: memory stays within a few blocks
whatever the file's size (a 5 GB file without one newline becomes bounded documents as it is read).

Every reader yields plain `str` documents and counts what it could not use in `counts` (a Counter).
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
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from lmpipe.runtime import StageError, log

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
_NEWLINE = re.compile("\n")
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


def split_text(texts: Iterator[str], split_by: str, max_chars: int) -> Iterator[str]:
    """Documents of a text that arrives in pieces: the parts between separators (blank lines, lines;
    none for `file`), each cut to `max_chars` at whitespace as `split_long` cuts it; `chunks` packs
    paragraphs up to `max_chars`. Only an unfinished part of under two documents is held in memory."""
    if split_by == "chunks":
        parts = join_paragraphs(_parts(texts, _BLANK_LINES, max_chars), max_chars)
    else:
        separator = {"paragraphs": _BLANK_LINES, "lines": _NEWLINE, "file": None}[split_by]
        parts = _parts(texts, separator, max_chars)
    for part in parts:
        yield from split_long(part, max_chars)


def _parts(texts: Iterator[str], separator: re.Pattern[str] | None, max_chars: int) -> Iterator[str]:
    buffer = ""
    for text in texts:
        buffer += text
        if separator is not None:
            pieces = separator.split(buffer)
            buffer = pieces.pop()  # it may go on in the next piece of text
            yield from pieces
        # a part with no separator in sight: the cuts `split_long` makes while more than `max_chars`
        # remain are decided already, so emit those pieces (a 5 GB line streams as documents)
        while len(buffer) > 2 * max_chars:
            window = (max_chars // 2, max_chars)
            cut = max(buffer.rfind(" ", *window), buffer.rfind("\n", *window))
            end = cut if cut > 0 else max_chars
            yield buffer[:end]
            buffer = buffer[end:]
    yield buffer


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
        if fmt == "parquet" and path.suffix != ".gz":
            if path.stat().st_size == 0:
                self._empty(path)
                return
            yield from self._parquet(path, pq.ParquetFile(path))
            return
        with open_binary(path) as handle:
            first = handle.read(SNIFF)
            if not first.strip() and len(first) < SNIFF:
                self._empty(path)
                return
            if fmt == "parquet":  # a compressed parquet file: its footer is at the end, so read it whole
                yield from self._parquet(path, pq.ParquetFile(pa.BufferReader(first + handle.read())))
                return
            if b"\x00" in first:
                self.counts["binary_files_skipped"] += 1
                log.warning("%s: binary file (NUL bytes), skipped", path)
                return
            stream = io.BufferedReader(_Prepended(first, handle), BLOCK)  # the sniffed bytes first
            if fmt == "jsonl":
                docs = self._jsonl(path, stream)
            else:
                texts = self.decoder.decode(iter(lambda: stream.read(BLOCK), b""), path)
                if fmt == "txt":
                    docs = split_text(texts, self.split_by, self.max_chars)
                elif fmt == "json":
                    docs = self._json(path, "".join(texts))
                else:
                    docs = self._csv(path, texts)
            for doc in docs:
                resolved = self.decoder.resolve(doc)
                if resolved is not None:
                    yield resolved

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
        reader = csv.DictReader(_lines(texts))
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
