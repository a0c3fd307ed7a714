"""The ids the tokenizer reserves: the same in the tokenizer stage, the objectives, the fine-tuning
inputs and the transformers export."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecialIds:
    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3
    cls: int = 4
    sep: int = 5
    mask: int = 6
    first_sentinel: int = 7
    n_sentinels: int = 100

    @property
    def n_special(self) -> int:
        """Every id below this is special: never selected for masking, never a random replacement."""
        return self.first_sentinel + self.n_sentinels

    def sentinel(self, i: int) -> int:
        if not 0 <= i < self.n_sentinels:
            raise ValueError(f"sentinel {i} out of range (there are {self.n_sentinels})")
        return self.first_sentinel + i


SPECIAL = SpecialIds()

# the tokenizer's pieces of those ids: SentencePiece's own four, then control symbols in id order
BASE_SPECIALS = {"<pad>": SPECIAL.pad, "<unk>": SPECIAL.unk, "<s>": SPECIAL.bos, "</s>": SPECIAL.eos}
CONTROL_SYMBOLS = ["[CLS]", "[SEP]", "[MASK]"] + [f"<extra_id_{i}>" for i in range(SPECIAL.n_sentinels)]
SPECIAL_IDS = {**BASE_SPECIALS, **{piece: SPECIAL.cls + i for i, piece in enumerate(CONTROL_SYMBOLS)}}
