"""Text into documents of bounded size: by blank lines, lines or whole, packed into chunks, and cut at
whitespace past a maximum; streaming (only an unfinished part is held in memory)."""

from __future__ import annotations

import re
from collections.abc import Iterator

_BLANK_LINES = re.compile(r"\n[ \t]*\n")
_NEWLINE = re.compile("\n")


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
