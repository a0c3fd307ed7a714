"""RoBERTa's input formats by name (models/input_formats.py builds their rows): what
`pretrain.input_format` may say, and which of them are pairs of segments."""

from __future__ import annotations

from typing import Literal

InputFormat = Literal["full_sentences", "doc_sentences", "segment_pair", "sentence_pair"]
PAIR_FORMATS = ("segment_pair", "sentence_pair")
