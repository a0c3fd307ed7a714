"""Text normalisation and the per-document quality rules of `clean` (after Gopher and C4).

Pure functions of one document, run in worker processes; dedup across documents happens in the stage.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import zlib
from collections import Counter
from functools import cache

import numpy as np
from datasketch import LeanMinHash, MinHash

from stages.dedup import mix64
from stages.params import CleanParams

# control and format characters (zero-width spaces, BOMs, bidi marks) except the newline
_INVISIBLE = re.compile(
    r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff\ufff9-\ufffb]"
)
_SPACES = re.compile(r"[^\S\n]+")  # runs of whitespace other than newlines, including NBSP
_SPACE_AROUND_NEWLINE = re.compile(r" ?\n ?")
_MANY_NEWLINES = re.compile(r"\n{3,}")
_LETTERS = re.compile(r"[^\W\d_]+")
_DIGITS = re.compile(r"\d+")
# symbols: neither letters, digits, whitespace nor ordinary sentence punctuation
_SYMBOLS = re.compile(r"""[^\w\s.,;:!?'"()\-\u2018\u2019\u201c\u201d\u2013\u2014]+""")

RULES = (
    "empty",
    "too_few_chars",
    "too_many_chars",
    "too_few_words",
    "mean_word_length",
    "alpha_ratio",
    "digit_ratio",
    "symbol_ratio",
    "duplicate_lines",
    "duplicate_line_chars",
    "top_ngram",
    "duplicate_ngrams",
    "bad_phrase",
    "exact_duplicate",
    "near_duplicate",
)


def normalize(text: str) -> str:
    """NFC, no control or invisible characters, single spaces, at most one blank line in a row."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", " "))
    text = _INVISIBLE.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _SPACE_AROUND_NEWLINE.sub("\n", text)
    return _MANY_NEWLINES.sub("\n\n", text).strip()


def _matched_chars(pattern: re.Pattern[str], text: str) -> int:
    return len(text) - len(pattern.sub("", text))


def _word_ids(words: list[str]) -> tuple[np.ndarray, list[str]]:
    """Each word's index in the document's vocabulary (in order of first use), and that vocabulary."""
    index = {word: i for i, word in enumerate(dict.fromkeys(words))}
    return np.fromiter(map(index.__getitem__, words), np.intp, len(words)), list(index)


def _gram_keys(ids: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit key of every n-gram of `ids` (collisions: ~n_grams² / 2⁶⁴, none in practice)."""
    count = len(ids) - n + 1
    keys = np.zeros(count, dtype=np.uint64)
    for k in range(n):
        keys = mix64(keys ^ ids[k : k + count])
    return keys


def _top_ngram_chars(keys: np.ndarray, lengths: np.ndarray, n: int) -> tuple[int, int]:
    """(count, characters) of the most frequent n-gram; on a tie the one seen first (Counter's order)."""
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    top = first[counts == counts.max()].min()
    return int(counts.max()), int(lengths[top : top + n].sum())


def _duplicate_ngram_chars(keys: np.ndarray, lengths: np.ndarray, n: int) -> int:
    """Characters of words inside an n-gram seen earlier in the document (first occurrence free)."""
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    starts = np.flatnonzero(first[inverse] != np.arange(len(keys)))
    cover = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.add.at(cover, starts, 1)
    np.add.at(cover, starts + n, -1)
    return int(lengths[np.cumsum(cover[:-1]) > 0].sum())


def failed_rule(text: str, cfg: CleanParams) -> str | None:
    """The first quality rule `text` (already normalised) breaks, or None."""
    n_chars = len(text)
    if n_chars == 0:
        return "empty"
    if n_chars < cfg.min_chars:
        return "too_few_chars"
    if n_chars > cfg.max_chars:
        return "too_many_chars"
    words = text.split()
    if len(words) < cfg.min_words:
        return "too_few_words"
    word_chars = sum(map(len, words))
    if not cfg.min_mean_word_length <= word_chars / len(words) <= cfg.max_mean_word_length:
        return "mean_word_length"
    if _matched_chars(_LETTERS, text) < cfg.min_alpha_ratio * word_chars:
        return "alpha_ratio"
    if _matched_chars(_DIGITS, text) > cfg.max_digit_ratio * word_chars:
        return "digit_ratio"
    if _matched_chars(_SYMBOLS, text) > cfg.max_symbol_ratio * word_chars:
        return "symbol_ratio"
    lines = [line for line in text.split("\n") if line]
    if len(lines) > 1:
        line_counts = Counter(lines)
        repeats = [(count - 1, len(line)) for line, count in line_counts.items() if count > 1]
        if sum(r for r, _ in repeats) > cfg.max_duplicate_line_fraction * len(lines):
            return "duplicate_lines"
        if sum(r * size for r, size in repeats) > cfg.max_duplicate_line_char_fraction * n_chars:
            return "duplicate_line_chars"
    ids, vocab = _word_ids(text.lower().split())
    lengths = np.fromiter(map(len, vocab), np.int64, len(vocab))[ids]
    ids = ids.astype(np.uint64)
    for n, limit in sorted(cfg.max_top_ngram_char_fraction.items()):
        if len(ids) < n:
            continue
        count, gram_chars = _top_ngram_chars(_gram_keys(ids, n), lengths, n)
        if count > 1 and count * gram_chars > limit * word_chars:
            return "top_ngram"
    limits = sorted(cfg.max_duplicate_ngram_char_fraction.items())
    for index, (n, limit) in enumerate(limits):
        if len(ids) < n:
            break
        duplicated = _duplicate_ngram_chars(_gram_keys(ids, n), lengths, n)
        if duplicated > limit * word_chars:
            return "duplicate_ngrams"
        # larger n-grams repeat only inside smaller repeated ones: stop once under every later limit
        if duplicated <= min(lim for _, lim in limits[index:]) * word_chars:
            break
    if cfg.bad_phrases:
        folded = text.casefold()
        if any(phrase.casefold() in folded for phrase in cfg.bad_phrases):
            return "bad_phrase"
    return None


def exact_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


@cache
def _template(num_perm: int, seed: int) -> MinHash:
    """A MinHash's permutations and scheme, drawn once per process rather than per document."""
    return MinHash(num_perm=num_perm, seed=seed)


def shingle_hashes(text: str, n: int) -> np.ndarray:
    """32-bit hashes of the distinct n-word shingles of the lowercased text (all its words if fewer):
    each word hashed once (CRC-32), each shingle a mix of its words' hashes, in numpy."""
    words = text.lower().split()
    ids, vocab = _word_ids(words)
    word_hashes = np.fromiter((zlib.crc32(w.encode("utf-8")) for w in vocab), np.uint64, len(vocab))[ids]
    keys = _gram_keys(word_hashes, min(n, len(words))) if words else np.zeros(1, np.uint64)
    return np.unique(keys >> np.uint64(32))


def minhash_signature(text: str, cfg: CleanParams, seed: int) -> LeanMinHash:
    """datasketch's MinHash of the text's shingles, fed their hashes (its hash function is the identity)."""
    template = _template(cfg.near_dedup.num_perm, seed)
    sig = MinHash(
        num_perm=template.hashvalues.size,
        seed=seed,
        hashfunc=int,
        permutations=template.permutations,
        scheme=template.scheme,
    )
    sig.update_batch(shingle_hashes(text, cfg.near_dedup.shingle_words).tolist())
    return LeanMinHash(sig)
