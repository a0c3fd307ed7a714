"""Text as people have it, read without hand-editing: WikiExtractor's `<doc>` files as one document per
article with its title and url, Project Gutenberg books (CRLF, gzip) with their header and licence
footer marked by ingest and dropped, counted, by clean's `gutenberg_boilerplate` rule."""

from __future__ import annotations

import gzip
import json

import pyarrow.parquet as pq
import pytest

from lmpipe.data import gutenberg
from stages import clean, ingest
from tests.pipeline_helpers import clean_texts
from tests.texts import prose


def article(doc_id: int, title: str, paragraphs: list[str]) -> str:
    url = f"http://en.wikipedia.org/wiki?curid={doc_id}"
    body = "\n".join(paragraphs)
    return f'<doc id="{doc_id}" url="{url}" title="{title}">\n{title}\n\n{body}\n</doc>\n'


def read(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def documents(workdir, source: str) -> list[dict]:
    files = sorted((workdir.path / "data/raw" / source).glob("*.parquet"))
    return [row for path in files for row in read(path)]


def test_wikiextractor_files_give_one_document_per_article_with_its_title_and_url(workdir) -> None:
    first = article(12, "Anarchism", [prose(1), "Etymology and terminology.", prose(2)])
    second = article(25, 'The "Quoted" Title', [prose(3)])
    folder = workdir.path / "wiki"
    folder.mkdir()
    (folder / "wiki_00.txt.gz").write_bytes(gzip.compress((first + second).encode()))
    (folder / "wiki_01").write_text(article(39, "Albedo", [prose(4)]))  # WikiExtractor's own names
    workdir.sources(wiki={"path": "wiki"})
    ingest.main(["wiki"])

    docs = documents(workdir, "wiki")
    assert [json.loads(d["meta"]) for d in docs] == [
        {"title": "Anarchism", "url": "http://en.wikipedia.org/wiki?curid=12", "wiki_id": "12"},
        {"title": 'The "Quoted" Title', "url": "http://en.wikipedia.org/wiki?curid=25", "wiki_id": "25"},
        {"title": "Albedo", "url": "http://en.wikipedia.org/wiki?curid=39", "wiki_id": "39"},
    ]
    assert not any("<doc" in d["text"] or "</doc>" in d["text"] for d in docs)
    assert docs[0]["text"] == "\n".join(["Anarchism", "", prose(1), "Etymology and terminology.", prose(2)])
    counts = json.loads((workdir.path / "metrics/ingest/wiki.json").read_text())
    assert counts["documents"] == 3  # one per article, whatever ingest.split_by says

    # the metadata goes through clean with the text
    workdir.set("clean.min_chars", 50)
    workdir.set("clean.min_words", 10)
    clean.main()
    kept = [row for path in sorted((workdir.path / "data/clean").glob("*.parquet")) for row in read(path)]
    assert [json.loads(row["meta"])["title"] for row in kept] == ["Anarchism", 'The "Quoted" Title', "Albedo"]


HEADER = [
    "The Project Gutenberg EBook of The Harbour, by A. Writer",
    "",
    "This eBook is for the use of anyone anywhere at no cost and with almost no restrictions whatsoever.",
    "You may copy it, give it away or re-use it under the terms of the Project Gutenberg License included",
    "with this eBook or online at www.gutenberg.org",
    "",
    "Title: The Harbour",
    "",
    "*** START OF THIS PROJECT GUTENBERG EBOOK THE HARBOUR ***",
]
FOOTER = [
    "End of the Project Gutenberg EBook of The Harbour, by A. Writer",
    "",
    "*** END OF THIS PROJECT GUTENBERG EBOOK THE HARBOUR ***",
    "",
    "Updated editions will replace the previous one--the old editions will be renamed. Creating the works",
    "from public domain print editions means that no one owns a United States copyright in these works.",
]
OLD_HEADER = [
    "***The Project Gutenberg Etext of The Harbour***",
    "",
    "***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***",
    'Why is this "Small Print!" statement here? You know: lawyers.',
    "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*",
]
OLD_FOOTER = ["End of The Project Gutenberg Etext of The Harbour"]


def book(header: list[str], chapters: list[str], footer: list[str]) -> bytes:
    """A book as Project Gutenberg serves it: CRLF line endings."""
    lines = [*header, "", *"\n\n".join(chapters).split("\n"), "", *footer]
    return "\r\n".join(lines).encode() + b"\r\n"


@pytest.mark.parametrize("edition", ["current", "1990s"])
def test_gutenberg_header_and_footer_are_dropped_by_a_counted_rule(workdir, edition: str) -> None:
    header, footer = (HEADER, FOOTER) if edition == "current" else (OLD_HEADER, OLD_FOOTER)
    chapters = [prose(10 + i, 120) for i in range(6)]
    folder = workdir.path / "books"
    folder.mkdir()
    (folder / "gutenberg_1_the_harbour.txt.gz").write_bytes(gzip.compress(book(header, chapters, footer)))
    workdir.sources(books={"path": "books"})
    ingest.main(["books"])

    marks = [json.loads(d["meta"]).get("gutenberg", "body") for d in documents(workdir, "books")]
    assert marks == sorted(marks, key=["header", "body", "footer"].index)  # in the book's order
    assert marks.count("body") == len(chapters) and "header" in marks and "footer" in marks

    clean.main()
    assert clean_texts(workdir.path) == chapters  # no line of the header or the footer, no CR
    report = json.loads((workdir.path / "metrics/clean.json").read_text())
    marked = len(marks) - len(chapters)
    assert report["dropped"]["gutenberg_boilerplate"] == marked
    boilerplate = sum(map(len, header + footer)) - len(header) - len(footer)  # without the newlines
    assert report["dropped_characters"]["gutenberg_boilerplate"] >= boilerplate

    workdir.set("clean.gutenberg_boilerplate", False)  # the rule off: the other rules judge the licence
    clean.main()
    report = json.loads((workdir.path / "metrics/clean.json").read_text())
    assert report["dropped"]["gutenberg_boilerplate"] == 0
    assert sum(report["dropped"].values()) + report["documents_kept"] == report["documents_in"] == len(marks)


def test_gutenberg_parts_do_not_depend_on_where_the_text_was_cut() -> None:
    text = book(HEADER, [prose(1), prose(2)], FOOTER).decode().replace("\r\n", "\n")
    whole = list(gutenberg.parts(iter([text])))
    for size in (1, 7, 64, 500):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        cut = list(gutenberg.parts(iter(pieces)))
        for part in ("header", "body", "footer"):
            assert "".join(t for p, t in cut if p == part) == "".join(t for p, t in whole if p == part)
    assert "".join(t for p, t in whole if p == "header").endswith("THE HARBOUR ***\n")
    assert "".join(t for p, t in whole if p == "footer").startswith("End of the Project Gutenberg EBook")
    # no markers: all of it is the body
    assert [p for p, _ in gutenberg.parts(iter(["A plain text.\nAbout Project Gutenberg.\n"]))] == ["body"]
