"""RoBERTa's input formats (its Table 2), built from the packed tokens and `pack.sentences`' index.

`full_sentences` is the packed stream cut into windows, across documents (what every other format
compares with, and what pretraining reads without an index: models/pretraining.py). The others need to
know where documents and sentences start:

- `doc_sentences`: whole sentences of one document from a random sentence on, as many as fit; a row
  that reaches its document's end stays short (padded).
- `segment_pair` (BERT's): sentences of one document from a random one on, up to the row, cut at a
  random sentence into segment A and segment B, `[CLS] A [SEP] B [SEP]`; half the time B is instead
  sentences from a random other document (BERT's next-sentence prediction, the label 1), or, for
  ALBERT's sentence-order prediction, A and B swapped (label 1). With `short_seq_prob` (BERT's
  `create_pretraining_data.py`: 0.1) a row gathers sentences up to a random target length in [2, the
  row's] instead, so that pretraining sees short inputs too (RoBERTa dropped them: 0, the default).
- `sentence_pair`: one sentence and the next (or, half the time, one from another document, or the two
  swapped), the same layout; such rows are short.

A pair longer than the row loses tokens from its longer segment, at its front or back by a coin (BERT's
`truncate_seq_pair`). Every choice is drawn from the micro-batch's generator: a batch is a pure function
of (seed, index), so a resumed run reads the same rows. EOS (the end of a document) is dropped from
pairs; a `doc_sentences` row keeps it as the last token of its document.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from models.special import SPECIAL
from models.specs.input_formats import PAIR_FORMATS

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass
class Rows:
    tokens: Tensor  # [B, L], right-padded with the pad id
    lengths: Tensor | None  # [B] real tokens per row; None when every row is full
    pair_labels: Tensor | None  # [B] a pair format's: 0 B follows A, 1 B is random (NSP) or swapped (SOP)


class SentenceIndex:
    """Where the sentences and documents of one split start (`pack.sentences`), read as memmaps."""

    def __init__(self, tokens: np.ndarray, folder: Path, split: str) -> None:
        self.tokens = tokens
        self.sentences = np.memmap(folder / f"{split}.sentences.bin", dtype=np.int64, mode="r")
        self.documents = np.memmap(folder / f"{split}.documents.bin", dtype=np.int64, mode="r")
        if len(self.documents) < 2:
            raise ValueError(f"{folder}/{split}: {len(self.documents)} document(s); a pair needs two")

    def span(self, sentence: int) -> tuple[int, int]:
        """The tokens [start, end) of a sentence."""
        start = int(self.sentences[sentence])
        end = int(self.sentences[sentence + 1]) if sentence + 1 < len(self.sentences) else len(self.tokens)
        return start, end

    def document_of(self, sentence: int) -> tuple[int, int]:
        """The sentences [first, stop) of the document a sentence belongs to."""
        doc = int(np.searchsorted(self.documents, self.sentences[sentence], side="right")) - 1
        first = int(np.searchsorted(self.sentences, self.documents[doc]))
        stop = (
            int(np.searchsorted(self.sentences, self.documents[doc + 1]))
            if doc + 1 < len(self.documents)
            else len(self.sentences)
        )
        return first, stop

    def ids(self, sentence: int, keep_eos: bool = False) -> np.ndarray:
        start, end = self.span(sentence)
        ids = np.asarray(self.tokens[start:end], dtype=np.int64)
        return ids if keep_eos or not len(ids) or ids[-1] != SPECIAL.eos else ids[:-1]


def draw(generator: torch.Generator, n: int) -> int:
    """A uniform integer in [0, n) from the batch's stream."""
    import torch

    return int(torch.randint(n, (1,), generator=generator))


def coin(generator: torch.Generator) -> bool:
    import torch

    return bool(torch.rand((), generator=generator) < 0.5)


def gather(
    index: SentenceIndex, first: int, stop: int, budget: int, keep_eos: bool = False
) -> list[np.ndarray]:
    """Sentences first, first + 1, ... before `stop` while they fit `budget` tokens (at least one)."""
    taken, used = [], 0
    for sentence in range(first, stop):
        ids = index.ids(sentence, keep_eos)
        if taken and used + len(ids) > budget:
            break
        taken.append(ids)
        used += len(ids)
    return taken


def truncate_pair(a: np.ndarray, b: np.ndarray, budget: int, generator: torch.Generator) -> tuple:
    """BERT's truncate_seq_pair: the longer segment loses a token, at its front or back, until both fit."""
    while len(a) + len(b) > budget:
        if len(a) >= len(b):
            a = a[1:] if coin(generator) else a[:-1]
        else:
            b = b[1:] if coin(generator) else b[:-1]
    return a, b


def random_other_document(index: SentenceIndex, first: int, stop: int, generator: torch.Generator) -> int:
    """A random sentence of a random document other than the sentences [first, stop)."""
    while True:
        sentence = draw(generator, len(index.sentences))
        if not first <= sentence < stop:
            return sentence


def target_length(budget: int, short_seq_prob: float, generator: torch.Generator) -> int:
    """BERT's target length of a segment pair: the row's `budget` or, `short_seq_prob` of the time, a
    uniform one in [2, budget]. No draw at 0, so that rows without short ones stay what they were."""
    import torch

    if short_seq_prob and bool(torch.rand((), generator=generator) < short_seq_prob):
        return 2 + draw(generator, budget - 1)
    return budget


def pair_row(
    index: SentenceIndex,
    anchor: int,
    length: int,
    fmt: str,
    loss: str,
    generator: torch.Generator,
    short_seq_prob: float = 0.0,
) -> tuple[np.ndarray, int]:
    """`[CLS] A [SEP] B [SEP]` from the anchor sentence on, and its pair label. A segment pair gathers
    sentences up to its target length (BERT's: shorter `short_seq_prob` of the time); a pair longer
    than the row is truncated to it."""
    budget = length - 3
    first, stop = index.document_of(anchor)
    if fmt == "segment_pair":
        target = target_length(budget, short_seq_prob, generator)
        chunk = gather(index, anchor, stop, target)
        split = 1 + draw(generator, len(chunk) - 1) if len(chunk) > 1 else 1
        a, b_parts = np.concatenate(chunk[:split]), chunk[split:]
    else:
        a, b_parts = index.ids(anchor), [index.ids(anchor + 1)] if anchor + 1 < stop else []
    b, label = np.concatenate(b_parts) if b_parts else np.empty(0, np.int64), 0
    if loss == "sop" and len(b) and coin(generator):  # ALBERT: the two swapped half the time
        a, b, label = b, a, 1
    elif loss == "nsp" and (not len(b) or coin(generator)):  # BERT: half the time, and at a document's end
        other = random_other_document(index, first, stop, generator)
        if fmt == "segment_pair":
            b = np.concatenate(gather(index, other, index.document_of(other)[1], target - len(a)))
        else:
            b = index.ids(other)
        label = 1
    a, b = truncate_pair(a, b, budget, generator)
    return np.concatenate([[SPECIAL.cls], a, [SPECIAL.sep], b, [SPECIAL.sep]]).astype(np.int64), label


def format_rows(
    index: SentenceIndex,
    fmt: str,
    loss: str,
    batch_size: int,
    length: int,
    generator: torch.Generator,
    short_seq_prob: float = 0.0,
) -> Rows:
    """A micro-batch of rows of `length` tokens in one of the formats that read the sentence index
    (`short_seq_prob`: segment pairs')."""
    import torch

    rows, labels = [], []
    for _ in range(batch_size):
        anchor = draw(generator, len(index.sentences))
        if fmt == "doc_sentences":
            sentences = gather(index, anchor, index.document_of(anchor)[1], length, keep_eos=True)
            rows.append(np.concatenate(sentences)[:length])
        else:
            row, label = pair_row(index, anchor, length, fmt, loss, generator, short_seq_prob)
            rows.append(row)
            labels.append(label)
    lengths = torch.tensor([len(row) for row in rows])
    tokens = torch.full((batch_size, length), SPECIAL.pad, dtype=torch.long)
    for j, row in enumerate(rows):
        tokens[j, : len(row)] = torch.from_numpy(row)
    full = bool((lengths == length).all())
    pair_labels = torch.tensor(labels) if fmt in PAIR_FORMATS and loss != "none" else None
    return Rows(tokens, None if full else lengths, pair_labels)
