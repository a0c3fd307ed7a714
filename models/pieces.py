"""The tokenizer's piece tables: [vocab] bool tables that an objective reads by name (its
`piece_tables`), built once from the SentencePiece model and added to its args by `make_batch`.

- `word_starts`: the pieces that begin a word (SentencePiece's ▁ mark), and the specials, each a word:
  whole-word and span masking (SpanBERT).
- `sentence_ends`: the pieces that end a sentence, a full stop, question or exclamation mark (with or
  without ▁, or as a byte-fallback piece), and the specials (a document's end): BART's sentence
  permutation, which fairseq splits at GPT-2's full-stop token."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from models.special import SPECIAL

if TYPE_CHECKING:
    from torch import Tensor

SENTENCE_END_PIECES = frozenset({".", "?", "!"})


def _table(spm_model: Path, holds: Callable[[str], bool]) -> Tensor:
    import sentencepiece as spm
    import torch

    processor = spm.SentencePieceProcessor(model_file=str(spm_model))

    def text(i: int) -> str:  # a byte-fallback piece (<0x3F>) as the character it stands for
        piece = processor.id_to_piece(i)
        return chr(int(piece[3:5], 16)) if processor.is_byte(i) else piece

    pieces = range(processor.get_piece_size())
    return torch.tensor([i < SPECIAL.n_special or holds(text(i)) for i in pieces])


def word_start_table(spm_model: Path) -> Tensor:
    return _table(spm_model, lambda piece: piece.startswith("▁"))


def sentence_end_table(spm_model: Path) -> Tensor:
    return _table(spm_model, lambda piece: piece.removeprefix("▁") in SENTENCE_END_PIECES)


TABLES: dict[str, Callable[[Path], Tensor]] = {
    "word_starts": word_start_table,
    "sentence_ends": sentence_end_table,
}


def piece_tables(spm_model: Path, names: Iterable[str]) -> dict[str, Tensor]:
    """The named tables of the tokenizer at `spm_model`."""
    return {name: TABLES[name](spm_model) for name in sorted(set(names))}
