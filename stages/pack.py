"""Stage `pack`: encode the clean documents into flat token arrays for pretraining.

`data/tokens/{train,val}.bin` hold every document's ids followed by EOS, back to back (uint16 when the
vocabulary fits, else uint32; read them with `np.memmap(path, dtype=meta["dtype"])`), and `meta.json`
records vocab size, dtype, token and document counts and the tokenizer's hash. Documents go to train
or val by a seeded permutation.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import sentencepiece as spm

from stages.common import (
    StageError,
    atomic_dir,
    cpu_threads,
    log,
    progress,
    read_json,
    run_main,
    write_json,
)
from stages.params import PackParams, load_params
from stages.tracking import stage_run

CLEAN = Path("data/clean")
TOKENIZER = Path("data/tokenizer")
OUT = Path("data/tokens")
SPLITS = ("train", "val")


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


def pack(
    documents: Path, processor: spm.SentencePieceProcessor, cfg: PackParams, seed: int, out_dir: Path
) -> dict[str, dict[str, int]]:
    dtype = token_dtype(processor.get_piece_size())
    table = pq.ParquetFile(documents)
    is_val = val_mask(table.metadata.num_rows, cfg.val_fraction, seed)
    threads = cpu_threads(cfg.threads)
    counts = {split: {"documents": 0, "tokens": 0} for split in SPLITS}
    handles = {split: open(out_dir / f"{split}.bin", "wb") for split in SPLITS}  # noqa: SIM115
    try:
        start = 0
        bar = progress(total=table.metadata.num_rows, desc="pack", unit="doc")
        for batch in table.iter_batches(batch_size=cfg.batch_documents, columns=["text"]):
            texts = batch.column(0).to_pylist()
            encoded = processor.encode(texts, out_type=int, add_eos=True, num_threads=threads)
            batch_val = is_val[start : start + len(texts)]
            start += len(texts)
            for split, picked in (("train", ~batch_val), ("val", batch_val)):
                docs = list(itertools.compress(encoded, picked))
                ids = flat_ids(docs, dtype)
                ids.tofile(handles[split])
                counts[split]["documents"] += len(docs)
                counts[split]["tokens"] += len(ids)
            bar.update(len(texts))
        bar.close()
    finally:
        for handle in handles.values():
            handle.close()
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
        processor = spm.SentencePieceProcessor(model_file=str(TOKENIZER / "spm.model"))
        with atomic_dir(OUT) as tmp:
            counts = pack(CLEAN / "documents.parquet", processor, cfg, params.seed, tmp)
            meta = {
                "vocab_size": processor.get_piece_size(),
                "dtype": token_dtype(processor.get_piece_size()).name,
                "eos_id": processor.eos_id(),
                "pad_id": processor.pad_id(),
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
