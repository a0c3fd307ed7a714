"""Training the SentencePiece model on a sample of the clean text: the work of stage `tokenizer`."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm

from lmpipe.data.draws import document_draws
from lmpipe.data.progress import Meter
from lmpipe.data.splitting import split_long
from lmpipe.params.tokenizer import TokenizerParams
from lmpipe.runtime import (
    StageError,
    cpu_threads,
    log,
)
from models.special import CONTROL_SYMBOLS, SPECIAL_IDS

MAX_SENTENCE_CHARS = 16_000  # SentencePiece skips longer "sentences"; we cut them instead


_TOO_BIG = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


def training_lines(
    paths: list[Path], cfg: TokenizerParams, total_chars: int, seed: int, stats: dict[str, int]
) -> Iterator[str]:
    """Lines of a seeded sample of documents, about `max_train_chars` in all. A document is drawn by its
    id and the seed alone, so a corpus that grows keeps every document it drew (as long as its share
    `max_train_chars / total_chars` stays), and adds the new documents it draws."""
    keep = min(1.0, cfg.max_train_chars / max(total_chars, 1))
    meter = Meter("tokenizer input", total_docs=sum(pq.read_metadata(path).num_rows for path in paths))
    for batch in _batches(paths):
        ids, texts = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        chosen = document_draws(ids, seed, "tokenizer") < keep
        for text, take in zip(texts, chosen, strict=True):
            if not take:
                continue
            stats["documents"] += 1
            stats["characters"] += len(text)
            for line in text.split("\n"):
                yield from split_long(line, MAX_SENTENCE_CHARS)
        meter.update(docs=len(texts), nbytes=sum(map(len, texts)))
    meter.close()


def _batches(paths: list[Path]) -> Iterator[pa.RecordBatch]:
    """The id and text columns in batches, one file open at a time (an open ParquetFile keeps the
    buffers it read: all of a 4 GB corpus's shards open at once held 1.8 GB)."""
    for path in paths:
        with pq.ParquetFile(path) as table_file:
            yield from table_file.iter_batches(batch_size=4096, columns=["id", "text"])


def train(lines: Iterator[str], cfg: TokenizerParams, seed: int) -> bytes:
    model = io.BytesIO()
    log.info("tokenizer: training SentencePiece %s, vocab %d", cfg.model_type, cfg.vocab_size)
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines,
            model_writer=model,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            byte_fallback=cfg.byte_fallback,
            normalization_rule_name=cfg.normalization,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            control_symbols=CONTROL_SYMBOLS,
            num_threads=cpu_threads(cfg.threads),
            max_sentence_length=4 * MAX_SENTENCE_CHARS,
            shuffle_input_sentence=True,
            train_extremely_large_corpus=False,
            minloglevel=2,
        )
    except RuntimeError as exc:
        too_big = _TOO_BIG.search(str(exc))
        if too_big:
            supported = int(too_big.group(2))
            fixed = len(SPECIAL_IDS) + (256 if cfg.byte_fallback else 0)
            raise StageError(
                f"tokenizer.vocab_size={cfg.vocab_size} is too large for this corpus: it supports at most "
                f"{supported} pieces ({fixed} of them specials{' and bytes' if cfg.byte_fallback else ''}); "
                "lower tokenizer.vocab_size or add text"
            ) from None
        raise StageError(f"tokenizer: SentencePiece failed: {str(exc).splitlines()[0]}") from None
    return model.getvalue()


def check_specials(processor: spm.SentencePieceProcessor) -> None:
    for piece, expected in SPECIAL_IDS.items():
        actual = processor.piece_to_id(piece)
        if actual != expected:  # would silently corrupt every later stage
            raise RuntimeError(f"special token {piece} got id {actual}, expected {expected}")
