"""Stage `tokenizer`: SentencePiece (unigram or BPE) trained on the clean text.

Writes `data/tokenizer/spm.model`, `spm.vocab` and `tokenizer.json` with the fixed special-token ids:
`<pad>`=0 `<unk>`=1 `<s>`=2 `</s>`=3 `[CLS]`=4 `[SEP]`=5 `[MASK]`=6 and `<extra_id_0..99>`=7..106.
Specials are control symbols: literal "[MASK]" in the text never becomes the mask token.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm

from lmpipe.data.readers import split_long
from lmpipe.layout import CLEAN, CLEAN_METRICS, TOKENIZER, clean_shards
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.params.tokenizer import TokenizerParams
from lmpipe.runtime import (
    Meter,
    StageError,
    atomic_dir,
    cpu_threads,
    log,
    read_json,
    run_main,
    write_json,
)
from lmpipe.tracking import stage_run, tracking_experiment
from models.special import CONTROL_SYMBOLS, SPECIAL_IDS

MAX_SENTENCE_CHARS = 16_000  # SentencePiece skips longer "sentences"; we cut them instead
_TOO_BIG = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


class TokenizerSections(Sections):
    tokenizer: TokenizerParams = TokenizerParams()


def training_lines(
    paths: list[Path], cfg: TokenizerParams, total_chars: int, seed: int, stats: dict[str, int]
) -> Iterator[str]:
    """Lines of a seeded sample of documents, about `max_train_chars` in all."""
    keep = min(1.0, cfg.max_train_chars / max(total_chars, 1))
    rng = np.random.default_rng(seed)
    meter = Meter("tokenizer input", total_docs=sum(pq.read_metadata(path).num_rows for path in paths))
    for batch in _text_batches(paths):
        texts = batch.column(0).to_pylist()
        chosen = rng.random(len(texts)) < keep
        for text, take in zip(texts, chosen, strict=True):
            if not take:
                continue
            stats["documents"] += 1
            stats["characters"] += len(text)
            for line in text.split("\n"):
                yield from split_long(line, MAX_SENTENCE_CHARS)
        meter.update(docs=len(texts), nbytes=sum(map(len, texts)))
    meter.close()


def _text_batches(paths: list[Path]) -> Iterator[pa.RecordBatch]:
    """The text column in batches, one file open at a time (an open ParquetFile keeps the buffers it
    read: all of a 4 GB corpus's shards open at once held 1.8 GB)."""
    for path in paths:
        with pq.ParquetFile(path) as table_file:
            yield from table_file.iter_batches(batch_size=4096, columns=["text"])


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


def main() -> None:
    params = load_stage_params(TokenizerSections)
    cfg = params.tokenizer
    manifest = read_json(CLEAN / "manifest.json", "clean")
    clean_metrics = read_json(CLEAN_METRICS, "clean")
    with stage_run(
        "tokenizer",
        tracking_experiment(),
        {"seed": params.seed, "tokenizer": cfg.model_dump()},
        {"data.synthetic": manifest["synthetic"]},
    ) as run:
        stats = {"documents": 0, "characters": 0}
        lines = training_lines(clean_shards(), cfg, clean_metrics["characters_kept"], params.seed, stats)
        model = train(lines, cfg, params.seed)
        processor = spm.SentencePieceProcessor(model_proto=model)
        check_specials(processor)
        digest = hashlib.sha256(model).hexdigest()
        with atomic_dir(TOKENIZER) as tmp:
            (tmp / "spm.model").write_bytes(model)
            vocab = "".join(
                f"{processor.id_to_piece(i)}\t{processor.get_score(i):.4f}\n"
                for i in range(processor.get_piece_size())
            )
            (tmp / "spm.vocab").write_text(vocab, encoding="utf-8")
            write_json(
                tmp / "tokenizer.json",
                {
                    "model_type": cfg.model_type,
                    "vocab_size": processor.get_piece_size(),
                    "normalization": cfg.normalization,
                    "byte_fallback": cfg.byte_fallback,
                    "special_ids": SPECIAL_IDS,
                    "pad_id": 0,
                    "unk_id": 1,
                    "bos_id": 2,
                    "eos_id": 3,
                    "cls_id": SPECIAL_IDS["[CLS]"],
                    "sep_id": SPECIAL_IDS["[SEP]"],
                    "mask_id": SPECIAL_IDS["[MASK]"],
                    "sentinel_ids": [SPECIAL_IDS["<extra_id_0>"], SPECIAL_IDS["<extra_id_99>"]],
                    "sha256": digest,
                    "trained_on": stats,
                    "synthetic": manifest["synthetic"],
                },
            )
        run.log_metrics({"trained_on": stats, "vocab_size": processor.get_piece_size()})
        run.set_tags({"tokenizer_sha256": digest})
        log.info(
            "tokenizer: %s, %d pieces, trained on %d documents (%.1f MB), sha256 %s",
            cfg.model_type,
            processor.get_piece_size(),
            stats["documents"],
            stats["characters"] / 1e6,
            digest[:12],
        )


if __name__ == "__main__":
    run_main(main)
