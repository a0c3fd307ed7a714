"""WikiExtractor's output as documents: one per article, its `<doc id=.. url=.. title=..>` line read
as the article's metadata and never part of its text.

WikiExtractor (Attardi) writes each article as

    <doc id="12" url="http://en.wikipedia.org/wiki?curid=12" title="Anarchism">
    Anarchism
    ...
    </doc>

The title stays the article's first line, as WikiExtractor writes it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator

# the title is last and may itself hold quotes
_OPEN = re.compile(r'<doc id="(?P<id>[^"]*)" url="(?P<url>[^"]*)" title="(?P<title>.*)">\s*$')
_CLOSE = "</doc>"


def is_extract(first_bytes: bytes) -> bool:
    return first_bytes.lstrip().startswith(b"<doc ")


def articles(lines: Iterator[str], counts: Counter) -> Iterator[tuple[str, Iterator[str]]]:
    """(metadata as JSON, the article's lines) per article, in order, streaming. Text outside any
    <doc> is counted and skipped."""
    lines = iter(lines)
    for line in lines:
        opened = _OPEN.match(line)
        if opened is None:
            if line.strip():
                counts["lines_outside_articles_skipped"] += 1
            continue
        counts["articles"] += 1
        meta = {"title": opened["title"], "url": opened["url"], "wiki_id": opened["id"]}
        body = _body(lines, counts)
        yield json.dumps(meta, ensure_ascii=False), body
        for _ in body:  # what the reader left of the article: never read as text between articles
            pass


def _body(lines: Iterator[str], counts: Counter) -> Iterator[str]:
    for line in lines:
        if line.rstrip("\n") == _CLOSE:
            return
        yield line
    counts["articles_without_end_tag"] += 1  # the file ended inside the article: kept as far as it goes
