"""Stage `pack`: encode the clean documents into flat token arrays for pretraining.

`data/tokens/{train,val}.bin` hold every document's ids followed by EOS, back to back (uint16 when the
vocabulary fits, else uint32; read them with `np.memmap(path, dtype=meta["dtype"])`), and `meta.json`
records vocab size, dtype, token and document counts and the tokenizer's hash. Documents go to train
or val by a seeded permutation.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow.parquet as pq
import sentencepiece as spm

from stages.common import (
    Meter,
    StageError,
    atomic_dir,
    cpu_threads,
    log,
    read_json,
    run_main,
    write_json,
)
from stages.layout import CLEAN, TOKENIZER, TOKENS, clean_shards
from stages.params import PackParams, load_params
from stages.tracking import stage_run

SPLITS = ("train", "val")
T = TypeVar("T")
R = TypeVar("R")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def val_mask(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """True for the documents of the validation split: at least one, and never all of them."""
    if n_docs < 2:
        raise StageError(f"pack: {n_docs} clean document(s); a train/val split needs at least 2")
    n_val = min(max(1, round(n_docs * val_fraction)), n_docs - 1)
    mask = np.zeros(n_docs, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return mask


def flat_ids(encoded: list[list[int]], dtype: np.dtype) -> np.ndarray:
    total = sum(map(len, encoded))
    return np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=total)


def encode_batch(
    processor: spm.SentencePieceProcessor, dtype: np.dtype, texts: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of the documents back to back, each followed by EOS, and each document's length."""
    encoded = processor.encode(texts, out_type=int, add_eos=True, num_threads=1)
    return flat_ids(encoded, dtype), np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))


def ordered_map(fn: Callable[[T], R], items: Iterable[T], threads: int) -> Iterator[R]:
    """`map` on a thread pool, in order, with a bounded number of items in flight."""
    with ThreadPoolExecutor(threads) as executor:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(executor.submit(fn, item))
            if len(pending) > 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def encoded_batches(
    documents: list[Path], model_file: Path, dtype: np.dtype, threads: int, batch_documents: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Batches in document order. SentencePiece releases the GIL while it encodes, so small batches on
    a thread pool keep every core busy, also while another thread turns ids into arrays."""
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    batches = (
        b.column(0).to_pylist()
        for path in documents
        for b in pq.ParquetFile(path).iter_batches(batch_size=batch_documents, columns=["text"])
    )
    yield from ordered_map(partial(encode_batch, processor, dtype), batches, threads)


def pack(
    documents: list[Path], model_file: Path, cfg: PackParams, seed: int, out_dir: Path
) -> dict[str, dict[str, int]]:
    vocab_size = spm.SentencePieceProcessor(model_file=str(model_file)).get_piece_size()
    dtype = token_dtype(vocab_size)
    n_docs = sum(pq.ParquetFile(path).metadata.num_rows for path in documents)
    is_val = val_mask(n_docs, cfg.val_fraction, seed)
    threads = cpu_threads(cfg.threads)
    counts = {split: {"documents": 0, "tokens": 0} for split in SPLITS}
    start = 0
    meter = Meter("pack", total_docs=n_docs)
    with open(out_dir / "train.bin", "wb") as train, open(out_dir / "val.bin", "wb") as val:
        for ids, lengths in encoded_batches(documents, model_file, dtype, threads, cfg.batch_documents):
            doc_is_val = is_val[start : start + len(lengths)]
            start += len(lengths)
            token_is_val = np.repeat(doc_is_val, lengths)
            for split, handle, picked, docs in (
                ("train", train, ~token_is_val, ~doc_is_val),
                ("val", val, token_is_val, doc_is_val),
            ):
                chosen = ids[picked]
                chosen.tofile(handle)
                counts[split]["documents"] += int(docs.sum())
                counts[split]["tokens"] += len(chosen)
            meter.update(docs=len(lengths))
    meter.close()
    return counts


def main() -> None:
    params = load_params()
    cfg = params.pack
    manifest = read_json(CLEAN / "manifest.json", "clean")
    tok_meta = read_json(TOKENIZER / "tokenizer.json", "tokenizer")
    with stage_run(
        "pack",
        params.tracking.experiment,
        {"seed": params.seed, "pack": cfg.model_dump()},
        {"data.synthetic": manifest["synthetic"], "tokenizer_sha256": tok_meta["sha256"]},
    ) as run:
        with atomic_dir(TOKENS) as tmp:
            counts = pack(clean_shards(), TOKENIZER / "spm.model", cfg, params.seed, tmp)
            meta = {
                "vocab_size": tok_meta["vocab_size"],
                "dtype": token_dtype(tok_meta["vocab_size"]).name,
                "eos_id": tok_meta["eos_id"],
                "pad_id": tok_meta["pad_id"],
                "tokenizer_sha256": tok_meta["sha256"],
                "seed": params.seed,
                "val_fraction": cfg.val_fraction,
                "synthetic": manifest["synthetic"],
                **counts,
            }
            write_json(tmp / "meta.json", meta)
        run.log_metrics(counts)
        log.info(
            "pack: train %d tokens (%d docs), val %d tokens (%d docs), %s",
            counts["train"]["tokens"],
            counts["train"]["documents"],
            counts["val"]["tokens"],
            counts["val"]["documents"],
            meta["dtype"],
        )


if __name__ == "__main__":
    run_main(main)
