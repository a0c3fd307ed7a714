"""Project Gutenberg books as they come: the header (title page, licence notes, "small print") before
the START line and the licence footer from the END line on, found while the book streams past.

`parts` marks each piece of the text as header, body or footer; ingest keeps the marks with the
documents and clean's `gutenberg_boilerplate` rule drops what is not the body, counted like any other
rule. The markers are those of the c-w/gutenberg library's `strip_headers` that this era of books
uses: the "*** START OF THE PROJECT GUTENBERG EBOOK ..." lines, and in the 1990s files the end of
the "*END*THE SMALL PRINT!" notice and "End of (the|this) Project Gutenberg Etext ...".
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# a book carries the name in its first lines; others are never split
SIGNATURE = re.compile(rb"project gutenberg", re.IGNORECASE)
# the body starts after the last of these within the first HEADER_LINES lines
_START = re.compile(
    r"^(\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*|\*+ ?END\*? ?THE SMALL PRINT.*)$",
    re.MULTILINE | re.IGNORECASE,
)
# the footer starts at the first of these
_END = re.compile(
    r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*|End of (the |this )?Project Gutenberg.*)$",
    re.MULTILINE | re.IGNORECASE,
)
HEADER_LINES = 600  # as strip_headers: a START line further in is the book's own text


def is_book(first_bytes: bytes) -> bool:
    return SIGNATURE.search(first_bytes) is not None


def parts(texts: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(part, text) pieces of a book's text in order, part one of "header", "body", "footer"; the
    marker lines go with the header and the footer. Memory: the first HEADER_LINES lines and one
    piece of text."""
    texts = iter(texts)
    head, lines = "", 0
    for text in texts:
        head += text
        lines += text.count("\n")
        if lines >= HEADER_LINES:
            break
    window_end = _end_of_line(head, HEADER_LINES)
    starts = list(_START.finditer(head, 0, window_end))
    body_from = 0
    if starts:
        body_from = min(len(head), starts[-1].end() + 1)  # after the marker line and its newline
        yield "header", head[:body_from]
    pieces = _whole_lines(head[body_from:], texts)
    for piece in pieces:
        end = _END.search(piece)
        if end is None:
            yield "body", piece
            continue
        if end.start():
            yield "body", piece[: end.start()]
        yield "footer", piece[end.start() :]
        yield from (("footer", rest) for rest in pieces)
        return


def _end_of_line(text: str, n: int) -> int:
    """Where the first `n` lines of `text` end (all of it when it has fewer)."""
    at = -1
    for _ in range(n):
        at = text.find("\n", at + 1)
        if at < 0:
            return len(text)
    return at


def _whole_lines(first: str, texts: Iterator[str]) -> Iterator[str]:
    """`first`, then `texts`, in pieces that end at a line's end (a marker is never cut in two)."""
    carry = first
    for text in texts:
        joined = carry + text
        cut = joined.rfind("\n") + 1
        if cut:
            yield joined[:cut]
        carry = joined[cut:]
    if carry:
        yield carry
