"""Text normalisation and the per-document quality rules of `clean` (after Gopher and C4).

Pure functions of one document, run in worker processes; dedup across documents happens in the stage.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter

from datasketch import LeanMinHash, MinHash

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


def _duplicate_ngram_chars(ids: list[int], lengths: list[int], n: int) -> int:
    """Characters of words inside an n-gram seen earlier in the document (first occurrence free)."""
    seen: set[tuple[int, ...]] = set()
    marked = bytearray(len(ids))
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        if gram in seen:
            marked[i : i + n] = b"\x01" * n
        else:
            seen.add(gram)
    return sum(length for length, m in zip(lengths, marked, strict=True) if m)


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
    lowered = [w.lower() for w in words]
    vocab: dict[str, int] = {}
    ids = [vocab.setdefault(w, len(vocab)) for w in lowered]
    lengths = list(map(len, lowered))
    id_lengths = list(map(len, vocab))
    for n, limit in sorted(cfg.max_top_ngram_char_fraction.items()):
        if len(ids) < n:
            continue
        gram, count = Counter(zip(*(ids[i:] for i in range(n)), strict=False)).most_common(1)[0]
        if count > 1:
            gram_chars = sum(id_lengths[g] for g in gram)
            if count * gram_chars > limit * word_chars:
                return "top_ngram"
    limits = sorted(cfg.max_duplicate_ngram_char_fraction.items())
    for index, (n, limit) in enumerate(limits):
        duplicated = _duplicate_ngram_chars(ids, lengths, n)
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


def shingles(text: str, n: int) -> set[bytes]:
    words = text.lower().split()
    if len(words) <= n:
        return {" ".join(words).encode("utf-8")}
    return {" ".join(words[i : i + n]).encode("utf-8") for i in range(len(words) - n + 1)}


def minhash_signature(text: str, cfg: CleanParams, seed: int) -> LeanMinHash:
    sig = MinHash(num_perm=cfg.near_dedup.num_perm, seed=seed)
    sig.update_batch(list(shingles(text, cfg.near_dedup.shingle_words)))
    return LeanMinHash(sig)
