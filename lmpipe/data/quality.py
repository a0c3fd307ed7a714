"""Text normalisation and the per-document quality rules of `clean` (after Gopher and C4).

Pure functions of one document, run in worker processes; dedup across documents happens in the stage.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from datasketch import LeanMinHash, MinHash

from lmpipe.data.dedup import mix64
from lmpipe.params.clean import CleanParams
from lmpipe.schemas import NO_META

# control and format characters (zero-width spaces, BOMs, bidi marks) except the newline
_INVISIBLE = re.compile(
    r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff\ufff9-\ufffb]"
)
_MANY_NEWLINES = re.compile(r"\n{3,}")
_LETTERS = re.compile(r"[^\W\d_]+")
_DIGITS = re.compile(r"\d+")
# symbols: neither letters, digits, whitespace nor ordinary sentence punctuation
_SYMBOLS = re.compile(r"""[^\w\s.,;:!?'"()\-\u2018\u2019\u201c\u201d\u2013\u2014]+""")


def normalize(text: str) -> str:
    """NFC, no control or invisible characters, single spaces, at most one blank line in a row."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " "))
    text = _INVISIBLE.sub("", text)
    # str.split's whitespace is the regex's \s: each line's runs become one space, its ends none
    text = "\n".join(" ".join(line.split()) for line in text.split("\n"))
    if "\n\n\n" in text:
        text = _MANY_NEWLINES.sub("\n\n", text)
    return text.strip()


@cache
def _char_classes() -> np.ndarray:
    """Every code point's class for the ratio rules (0 other, 1 letter, 2 digit, 3 symbol): the rules'
    own patterns run once over all of Unicode, so a document's counts are one table lookup."""
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    table = np.zeros(sys.maxunicode + 1, dtype=np.uint8)
    for value, pattern in enumerate((_LETTERS, _DIGITS, _SYMBOLS), start=1):
        for match in pattern.finditer(everything):
            table[match.start() : match.end()] = value
    return table


def char_class_counts(text: str) -> np.ndarray:
    """(other, letters, digits, symbols) characters of the text."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return np.bincount(_char_classes()[codes], minlength=4)


class Words:
    """A document's lowercased words as indices into its vocabulary (in order of first use): split once
    for the n-gram rules and the MinHash shingles, and only when one of them asks (a document an
    earlier rule drops is never split)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def _index(self) -> dict[str, int]:
        return {word: i for i, word in enumerate(dict.fromkeys(self._words))}

    @cached_property
    def _words(self) -> list[str]:
        return self.text.lower().split()

    @cached_property
    def vocab(self) -> list[str]:
        return list(self._index)

    @cached_property
    def ids(self) -> np.ndarray:
        return np.fromiter(map(self._index.__getitem__, self._words), np.intp, len(self._words))


class _GramKeys:
    """A 64-bit key of every n-gram of `ids` (collisions: ~n_grams² / 2⁶⁴, none in practice), for any n:
    the n-gram keys extend the (n-1)-gram ones by one word, so each n costs one mixing pass."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids.astype(np.uint64)
        self._keys = [np.zeros(len(ids) + 1, dtype=np.uint64)]  # n = 0: one empty gram per position

    def __call__(self, n: int) -> np.ndarray:
        while len(self._keys) <= n:
            k = len(self._keys)  # the k-gram starting at i is the (k-1)-gram there and word i+k-1
            count = len(self.ids) - k + 1
            self._keys.append(mix64(self._keys[-1][:count] ^ self.ids[k - 1 : k - 1 + count]))
        return self._keys[n]


def _top_ngram_chars(keys: np.ndarray, lengths: np.ndarray, n: int) -> tuple[int, int]:
    """(count, characters) of the most frequent n-gram; on a tie the one seen first (Counter's order).
    (1, 0) when no n-gram repeats: the rule needs a repeat."""
    order = np.argsort(keys, kind="stable")  # equal keys in document order
    ordered = keys[order]
    edges = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1], [True]]))
    counts = edges[1:] - edges[:-1]
    most = counts.max()
    if most == 1:
        return 1, 0
    top = order[edges[:-1][counts == most]].min()
    return int(most), int(lengths[top : top + n].sum())


def _duplicate_ngram_chars(keys: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters of words inside an n-gram seen earlier in the document (first occurrence free)."""
    order = np.argsort(keys, kind="stable")  # equal keys in document order: the first leads its run
    ordered = keys[order]
    starts = order[1:][ordered[1:] == ordered[:-1]]
    cover = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.add.at(cover, starts, 1)
    np.add.at(cover, starts + n, -1)
    return int(lengths[np.cumsum(cover[:-1]) > 0].sum())


class Document:
    """A normalised document's figures, each computed when a rule first asks for it: a document an early
    rule drops is never split into words or n-grams."""

    def __init__(self, text: str, lowered: Words | None = None, meta: str = NO_META) -> None:
        self.text, self._lowered, self._meta = text, lowered, meta

    @cached_property
    def meta(self) -> dict:
        """What the reader knew of the document (lmpipe/schemas.py: DOCUMENTS' meta); most documents
        have nothing, and clean asks of every one."""
        return {} if self._meta == NO_META else json.loads(self._meta)

    @cached_property
    def n_chars(self) -> int:
        return len(self.text)

    @cached_property
    def words(self) -> list[str]:
        return self.text.split()

    @cached_property
    def word_chars(self) -> int:
        return sum(map(len, self.words))

    @cached_property
    def classes(self) -> np.ndarray:
        """(other, letters, digits, symbols) characters."""
        return char_class_counts(self.text)

    @cached_property
    def line_repeats(self) -> tuple[int, list[tuple[int, int]]]:
        """(non-empty lines, (extra copies, characters) of every line that repeats)."""
        lines = [line for line in self.text.split("\n") if line]
        return len(lines), [(count - 1, len(line)) for line, count in Counter(lines).items() if count > 1]

    @cached_property
    def lowered(self) -> Words:
        return self._lowered or Words(self.text)

    @cached_property
    def word_lengths(self) -> np.ndarray:
        vocab = self.lowered.vocab
        return np.fromiter(map(len, vocab), np.int64, len(vocab))[self.lowered.ids]

    @cached_property
    def grams(self) -> _GramKeys:
        return _GramKeys(self.lowered.ids)


def _top_ngram(doc: Document, cfg: CleanParams) -> bool:
    ids = doc.lowered.ids
    for n, limit in sorted(cfg.max_top_ngram_char_fraction.items()):
        if len(ids) < n:
            continue
        count, gram_chars = _top_ngram_chars(doc.grams(n), doc.word_lengths, n)
        if count > 1 and count * gram_chars > limit * doc.word_chars:
            return True
    return False


def _duplicate_ngrams(doc: Document, cfg: CleanParams) -> bool:
    limits = sorted(cfg.max_duplicate_ngram_char_fraction.items())
    for index, (n, limit) in enumerate(limits):
        if len(doc.lowered.ids) < n:
            break
        duplicated = _duplicate_ngram_chars(doc.grams(n), doc.word_lengths, n)
        if duplicated > limit * doc.word_chars:
            return True
        # larger n-grams repeat only inside smaller repeated ones: stop once under every later limit
        if duplicated <= min(lim for _, lim in limits[index:]) * doc.word_chars:
            break
    return False


def _bad_phrase(doc: Document, cfg: CleanParams) -> bool:
    folded = doc.text.casefold()
    return any(phrase.casefold() in folded for phrase in cfg.bad_phrases)


@dataclass(frozen=True)
class Rule:
    """One quality rule: its name (the counter in metrics/clean.json), the `clean` params it reads, what
    it drops, and its check of one document (None: a rule over the whole corpus, the dedup phases)."""

    name: str
    params: tuple[str, ...]
    drops: str
    breaks: Callable[[Document, CleanParams], bool] | None = None


# in the order they are tried: a dropped document is counted against the first rule it breaks
RULES: tuple[Rule, ...] = (
    Rule(
        "gutenberg_boilerplate",
        ("gutenberg_boilerplate",),
        "a Project Gutenberg book's header or licence footer, as ingest marks them",
        lambda d, c: c.gutenberg_boilerplate and "gutenberg" in d.meta,
    ),
    Rule("empty", (), "nothing left after normalisation", lambda d, c: d.n_chars == 0),
    Rule("too_few_chars", ("min_chars",), "fewer characters", lambda d, c: d.n_chars < c.min_chars),
    Rule("too_many_chars", ("max_chars",), "more characters", lambda d, c: d.n_chars > c.max_chars),
    Rule("too_few_words", ("min_words",), "fewer words", lambda d, c: len(d.words) < c.min_words),
    Rule(
        "mean_word_length",
        ("min_mean_word_length", "max_mean_word_length"),
        "a mean word length outside the range (Gopher)",
        lambda d, c: not c.min_mean_word_length <= d.word_chars / len(d.words) <= c.max_mean_word_length,
    ),
    Rule(
        "alpha_ratio",
        ("min_alpha_ratio",),
        "fewer letters than this share of the words' characters",
        lambda d, c: d.classes[1] < c.min_alpha_ratio * d.word_chars,
    ),
    Rule(
        "digit_ratio",
        ("max_digit_ratio",),
        "more digits than this share",
        lambda d, c: d.classes[2] > c.max_digit_ratio * d.word_chars,
    ),
    Rule(
        "symbol_ratio",
        ("max_symbol_ratio",),
        "more symbols (neither letters, digits nor punctuation) than this share",
        lambda d, c: d.classes[3] > c.max_symbol_ratio * d.word_chars,
    ),
    Rule(
        "duplicate_lines",
        ("max_duplicate_line_fraction",),
        "more repeated lines than this share of the lines (Gopher)",
        lambda d, c: d.line_repeats[0] > 1
        and sum(r for r, _ in d.line_repeats[1]) > c.max_duplicate_line_fraction * d.line_repeats[0],
    ),
    Rule(
        "duplicate_line_chars",
        ("max_duplicate_line_char_fraction",),
        "more characters in repeated lines than this share (Gopher)",
        lambda d, c: d.line_repeats[0] > 1
        and sum(r * size for r, size in d.line_repeats[1]) > c.max_duplicate_line_char_fraction * d.n_chars,
    ),
    Rule(
        "top_ngram",
        ("max_top_ngram_char_fraction",),
        "a most frequent n-gram covering more than its share of the characters, per n (Gopher)",
        _top_ngram,
    ),
    Rule(
        "duplicate_ngrams",
        ("max_duplicate_ngram_char_fraction",),
        "more characters inside repeated n-grams than their share, per n (Gopher)",
        _duplicate_ngrams,
    ),
    Rule("bad_phrase", ("bad_phrases",), "any of the phrases, case-folded (C4)", _bad_phrase),
    Rule("exact_duplicate", ("exact_dedup",), "a document whose text an earlier one has (128-bit hash)"),
    Rule(
        "near_duplicate",
        ("near_dedup",),
        "a document in a MinHash-LSH cluster whose first document is kept (datasketch)",
    ),
)
DOCUMENT_RULES = tuple(rule for rule in RULES if rule.breaks is not None)


def failed_rule(text: str, cfg: CleanParams, lowered: Words | None = None, meta: str = NO_META) -> str | None:
    """The first per-document rule `text` (already normalised; `lowered` its Words, if made; `meta` the
    reader's metadata) breaks, or None."""
    doc = Document(text, lowered, meta)
    return next((rule.name for rule in DOCUMENT_RULES if rule.breaks(doc, cfg)), None)


def exact_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


@cache
def _template(num_perm: int, seed: int) -> MinHash:
    """A MinHash's permutations and scheme, drawn once per process rather than per document."""
    return MinHash(num_perm=num_perm, seed=seed)


def shingle_hashes(words: Words, n: int) -> np.ndarray:
    """32-bit hashes of the n-word shingles (all the words if fewer), repeats included (a MinHash is a
    minimum: they change nothing): each word hashed once (CRC-32), each shingle a mix of its words'."""
    if not len(words.ids):
        return np.zeros(1, np.uint64)
    vocab_hashes = np.fromiter(map(zlib.crc32, map(str.encode, words.vocab)), np.uint64, len(words.vocab))
    keys = _GramKeys(vocab_hashes[words.ids])(min(n, len(words.ids)))
    return keys >> np.uint64(32)


def minhash_signature(words: Words, cfg: CleanParams, seed: int) -> LeanMinHash:
    """datasketch's MinHash of the shingles' hashes (its hash function is the identity)."""
    template = _template(cfg.near_dedup.num_perm, seed)
    sig = MinHash(
        num_perm=template.hashvalues.size,
        seed=seed,
        hashfunc=int,
        permutations=template.permutations,
        scheme=template.scheme,
    )
    sig.update_batch(shingle_hashes(words, cfg.near_dedup.shingle_words).tolist())
    return LeanMinHash(sig)
