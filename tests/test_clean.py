"""`clean`: normalisation, each quality rule, exact and near dedup, counts, and the empty-result error."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpipe.data.quality import (
    _DIGITS,
    _LETTERS,
    _SYMBOLS,
    DOCUMENT_RULES,
    RULES,
    char_class_counts,
    failed_rule,
    normalize,
)
from lmpipe.params.clean import CleanParams
from lmpipe.schemas import NO_META
from stages import clean, ingest
from tests.pipeline_helpers import clean_texts
from tests.texts import WORDS, prose

CFG = CleanParams()


def test_normalize() -> None:
    raw = "Cafe\u0301\r\nline\ttwo  \u00a0three\u200b\x07\n\n\n\n end \ufeff"
    assert normalize(raw) == "Caf\u00e9\nline two three\n\nend"


# letters, a combining accent, digits, punctuation, symbols, an astral letter and emoji, and every kind
# of whitespace and invisible character that normalisation treats specially
ALPHABET = (
    "ab\u00e9e\u0301Z09.,;-_$%\u00a7\u20ac\U0001d538\U0001f600"
    " \u00a0\u2003\u3000\t\r\n\x0b\x85\u200b\u2028\ufeff"
)


def test_normalize_agrees_with_its_regex_definition() -> None:
    import re
    import unicodedata

    from lmpipe.data.quality import _INVISIBLE

    def reference(text: str) -> str:
        text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " "))
        text = re.sub(r"[^\S\n]+", " ", _INVISIBLE.sub("", text))
        return re.sub(r"\n{3,}", "\n\n", re.sub(r" ?\n ?", "\n", text)).strip()

    rng = random.Random(3)
    for _ in range(2000):
        text = "".join(rng.choices(ALPHABET, k=rng.randint(0, 40)))
        assert normalize(text) == reference(text), repr(text)


def test_character_classes_agree_with_the_rules_patterns() -> None:
    rng = random.Random(4)
    for _ in range(500):
        text = "".join(rng.choices(ALPHABET, k=rng.randint(0, 60)))
        expected = [len(text) - len(pattern.sub("", text)) for pattern in (_LETTERS, _DIGITS, _SYMBOLS)]
        assert list(char_class_counts(text)[1:]) == expected, repr(text)


# a document each per-document rule drops (and no rule before it): the test of every rule in RULES
EXAMPLES = {
    "gutenberg_boilerplate": prose(11),  # with META's mark: good prose, but the licence's
    "empty": "",
    "too_few_chars": "short text here.",
    "too_many_chars": " ".join(["words"] * 200),  # with CONFIGS' max_chars
    "too_few_words": "a" * 60 + " " + "b" * 60 + " " + "c" * 90,
    "mean_word_length": " ".join(["extraordinarily"] * 10 + [f"incomprehensibilities{i}" for i in range(30)]),
    "alpha_ratio": " ".join(f"{i:06d}x" for i in range(60)),
    "digit_ratio": prose(1) + " " + " ".join(f"a{i:04d}" for i in range(60)),
    "symbol_ratio": prose(2) + " " + " ".join("@@#$ %%&*" for _ in range(40)),
    "duplicate_lines": "\n".join([prose(3, 40)] + ["Subscribe to our newsletter today."] * 8),
    "duplicate_line_chars": "\n".join(
        [prose(9, 40), *["This long boilerplate footer line repeats itself in every page of the crawl."] * 4]
        + [prose(10, 40)]
    ),  # with CONFIGS' max_duplicate_line_fraction, so that the line count alone passes
    "top_ngram": " ".join(["the garden"] * 30 + [prose(4)]),
    "duplicate_ngrams": " ".join([prose(5, 40)] * 2 + [prose(6, 20)]),
    "bad_phrase": prose(7) + " Lorem Ipsum dolor sit amet.",
}


# what ingest's reader knew of the example (lmpipe/schemas.py: DOCUMENTS' meta)
META = {"gutenberg_boilerplate": json.dumps({"gutenberg": "footer"})}
CONFIGS = {
    "too_many_chars": {"max_chars": 1000},
    "duplicate_line_chars": {"max_duplicate_line_fraction": 0.9},
}


@pytest.mark.parametrize("rule", [rule.name for rule in DOCUMENT_RULES])
def test_each_rule(rule: str) -> None:
    cfg = CleanParams(**CONFIGS.get(rule, {}))
    (params,) = [r.params for r in RULES if r.name == rule]
    assert set(params) <= set(CleanParams.model_fields)  # the keys the docs' table names are real
    assert failed_rule(normalize(EXAMPLES[rule]), cfg, meta=META.get(rule, NO_META)) == rule
    assert failed_rule(normalize(prose(8)), cfg) is None


def write_raw(workdir, texts: list[str]) -> None:
    """One source `t` as ingest@t writes it."""
    raw = workdir.path / "data/raw/t"
    raw.mkdir(parents=True)
    ids = [f"t#{i}" for i in range(len(texts))]
    table = pa.table({"id": ids, "source": ["t"] * len(texts), "text": texts, "meta": [NO_META] * len(texts)})
    pq.write_table(table, raw / "part-00000.parquet", row_group_size=8)  # shards of 8 documents
    (raw / "manifest.json").write_text(json.dumps({"name": "t", "synthetic": False}))
    workdir.sources(t={"path": "unused"})


def kept(workdir) -> list[str]:
    return clean_texts(workdir.path)


@pytest.mark.parametrize("workers", [1, 2])
def test_dedup_and_every_drop_counted(workdir, workers: int) -> None:
    docs = [prose(100 + i, 120) for i in range(40)]
    near = docs[3].split()
    near[10] = "harbour"
    texts = docs + [docs[0], docs[1] + "  ", " ".join(near), "too short", prose(7) + " lorem ipsum"]
    write_raw(workdir, texts)
    workdir.set("clean.workers", workers)
    clean.main()
    report = json.loads((workdir.path / "metrics/clean.json").read_text())
    assert kept(workdir) == docs
    assert report["documents_in"] == len(texts) and report["documents_kept"] == 40
    assert report["dropped"]["exact_duplicate"] == 2
    assert report["dropped"]["near_duplicate"] == 1
    assert report["dropped"]["too_few_chars"] == 1 and report["dropped"]["bad_phrase"] == 1
    assert set(report["dropped"]) == {rule.name for rule in RULES}
    assert sum(report["dropped"].values()) == report["documents_in"] - report["documents_kept"]


def test_nothing_left_is_an_error_with_rule_counts(workdir) -> None:
    write_raw(workdir, ["tiny", "also tiny", prose(1, 40) + " lorem ipsum"])
    result = workdir.run("clean")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: clean: no documents left after cleaning (3 in); "
        "dropped by rule: too_few_chars=2, bad_phrase=1"
    )
    assert not (workdir.path / "data/clean").exists()
    assert not (workdir.path / "metrics/clean.json").exists()


def test_real_corpus(workdir, corpus_dir) -> None:
    wiki = {"path": str(corpus_dir), "include": ["wikitext2_raw_*.txt"], "split_by": "paragraphs"}
    workdir.sources(wiki=wiki)
    ingest.main(["wiki"])
    workdir.set("clean.workers", 2)
    clean.main()
    report = json.loads((workdir.path / "metrics/clean.json").read_text())
    # WikiText: headings (" = Title = ") are short paragraphs and go, articles stay
    assert report["dropped"]["too_few_chars"] > 1000
    assert 1000 < report["documents_kept"] < report["documents_in"]
    texts = kept(workdir)
    assert all(t == normalize(t) and len(t) >= CFG.min_chars for t in texts)
    assert len(set(texts)) == len(texts)


def _reference_ngram_rule(text: str, cfg: CleanParams) -> str | None:
    """Gopher's two n-gram rules written plainly (tuples, a Counter, a set), as a check on the numpy ones."""
    from collections import Counter

    words = [w.lower() for w in text.split()]
    word_chars = sum(map(len, words))
    for n, limit in sorted(cfg.max_top_ngram_char_fraction.items()):
        if len(words) >= n:
            gram, count = Counter(zip(*(words[i:] for i in range(n)), strict=False)).most_common(1)[0]
            if count > 1 and count * sum(map(len, gram)) > limit * word_chars:
                return "top_ngram"
    for n, limit in sorted(cfg.max_duplicate_ngram_char_fraction.items()):
        seen, marked = set(), [False] * len(words)
        for i in range(len(words) - n + 1):
            gram = tuple(words[i : i + n])
            if gram in seen:
                marked[i : i + n] = [True] * n
            seen.add(gram)
        if sum(len(w) for w, m in zip(words, marked, strict=True) if m) > limit * word_chars:
            return "duplicate_ngrams"
    return None


def test_the_ngram_rules_agree_with_their_plain_definition() -> None:
    rng = random.Random(5)
    cfg = CleanParams(min_chars=0, min_words=0, min_alpha_ratio=0.0, max_symbol_ratio=1.0, bad_phrases=[])
    for _ in range(300):
        base = " ".join(rng.choice(WORDS[: rng.randint(2, 12)]) for _ in range(rng.randint(5, 200)))
        text = normalize(base + (" " + base[: rng.randint(0, len(base))]) * rng.randint(0, 3))
        assert failed_rule(text, cfg) == _reference_ngram_rule(text, cfg)  # no other rule can fire here
