"""The `clean` section: the quality rules and deduplication."""

from __future__ import annotations

from pydantic import Field, model_validator

from lmpipe.params.schema import Fraction, Strict


class NearDedupParams(Strict):
    enabled: bool = True
    threshold: float = Field(0.8, gt=0.0, lt=1.0)
    num_perm: int = Field(128, ge=16, le=1024)
    shingle_words: int = Field(5, ge=1, le=20)


class CleanParams(Strict):
    """Quality rules after Gopher (Rae et al. 2021) and C4 (Raffel et al. 2020)."""

    gutenberg_boilerplate: bool = Field(
        True, description="drop a Project Gutenberg book's header and licence footer (ingest marks them)"
    )

    min_chars: int = Field(200, ge=0)
    max_chars: int = Field(1_000_000, ge=1)
    min_words: int = Field(30, ge=0)
    min_mean_word_length: float = Field(2.5, ge=0)
    max_mean_word_length: float = Field(12.0, ge=1)
    min_alpha_ratio: Fraction = 0.6
    max_digit_ratio: Fraction = 0.2
    max_symbol_ratio: Fraction = 0.15
    max_duplicate_line_fraction: Fraction = 0.3
    max_duplicate_line_char_fraction: Fraction = 0.2
    # Gopher: the most frequent n-gram may cover at most this fraction of the characters
    max_top_ngram_char_fraction: dict[int, Fraction] = {2: 0.20, 3: 0.18, 4: 0.16}
    # Gopher: characters inside duplicated n-grams may be at most this fraction
    max_duplicate_ngram_char_fraction: dict[int, Fraction] = {
        5: 0.15,
        6: 0.14,
        7: 0.13,
        8: 0.12,
        9: 0.11,
        10: 0.10,
    }
    bad_phrases: list[str] = ["lorem ipsum"]
    exact_dedup: bool = True
    near_dedup: NearDedupParams = NearDedupParams()
    workers: int = Field(0, ge=0, description="processes for the per-document rules; 0 = all cores")

    @model_validator(mode="after")
    def _ranges(self) -> CleanParams:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be <= max_chars ({self.max_chars})")
        if self.min_mean_word_length > self.max_mean_word_length:
            raise ValueError("min_mean_word_length must be <= max_mean_word_length")
        for key in (*self.max_top_ngram_char_fraction, *self.max_duplicate_ngram_char_fraction):
            if not 1 <= key <= 20:
                raise ValueError(f"n-gram sizes must be between 1 and 20, got {key}")
        return self
