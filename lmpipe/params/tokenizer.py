"""The `tokenizer` section: the SentencePiece model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lmpipe.params.schema import Strict


class TokenizerParams(Strict):
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = Field(1024, ge=200, le=1_000_000)
    character_coverage: float = Field(0.9995, gt=0.0, le=1.0)
    byte_fallback: bool = True
    normalization: Literal["nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"] = "nmt_nfkc"
    max_train_chars: int = Field(50_000_000, ge=1000, description="sample of clean text to train on")
    threads: int = Field(0, ge=0, description="0 = all cores")
