"""Data-stage throughput on real text: clean MB/s (near-dedup on), pack tokens/s, and pack against a
`datasets.Dataset.map(batched=True, num_proc=N)` + SentencePiece reference, in one process.

    CORPUS_DIR=../shared/data/corpus python bench/data_throughput.py [--repeats 5] [--copies 4]

Prints one JSON line per measure. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmpipe.data.packing import pack  # noqa: E402
from lmpipe.layout import CLEAN_STORE, PACK_STORE, clean_shards  # noqa: E402
from lmpipe.params.pack import PackParams  # noqa: E402
from lmpipe.params.project import load_params  # noqa: E402
from lmpipe.runtime import cpu_threads  # noqa: E402
from stages import clean, ingest, tokenizer  # noqa: E402

_reference_processor: spm.SentencePieceProcessor | None = None


def _reference_encode(batch: dict, model_file: str) -> dict:
    global _reference_processor
    if _reference_processor is None:
        _reference_processor = spm.SentencePieceProcessor(model_file=model_file)
    return {"ids": _reference_processor.encode(batch["text"], out_type=int, add_eos=True)}


def _reference_encode_sentences(batch: dict, model_file: str) -> dict:
    """`pack.sentences`' work as a researcher would write it: blingfire's sentences, each encoded, and
    each document's length in sentences beside its ids."""
    import blingfire

    global _reference_processor
    if _reference_processor is None:
        _reference_processor = spm.SentencePieceProcessor(model_file=model_file)
    ids, sentences = [], []
    for text in batch["text"]:
        encoded = _reference_processor.encode(blingfire.text_to_sentences(text).split("\n"), out_type=int)
        ids.append([token for sentence in encoded for token in sentence] + [_reference_processor.eos_id()])
        sentences.append([len(sentence) for sentence in encoded])
    return {"ids": ids, "sentence_lengths": sentences}


def ours_pack(documents: Path, model_file: Path, cfg: PackParams, out: Path) -> int:
    shutil.rmtree(PACK_STORE, ignore_errors=True)  # from the start each time, not from kept shards
    counts = pack([documents], model_file, cfg, 1, None, out)
    shutil.rmtree(PACK_STORE)
    return counts["train"]["tokens"] + counts["val"]["tokens"]


def clean_from_scratch() -> None:
    shutil.rmtree(CLEAN_STORE, ignore_errors=True)  # every shard judged again, not kept from the last repeat
    clean.main()


def reference_pack(documents: Path, model_file: str, workers: int, out: Path, sentences: bool = False) -> int:
    """What a researcher would write with `datasets`: map + SentencePiece, then one flat array (with
    `sentences`, each document split by blingfire and encoded sentence by sentence)."""
    import datasets

    ds = datasets.Dataset.from_parquet(str(documents), cache_dir=str(out / "cache"))
    encoded = ds.map(
        _reference_encode_sentences if sentences else _reference_encode,
        batched=True,
        num_proc=workers,
        remove_columns=ds.column_names,
        fn_kwargs={"model_file": model_file},
        load_from_cache_file=False,
    )
    flat = pa.chunked_array(encoded.data.column("ids").chunks).combine_chunks().flatten().to_numpy()
    ids = flat.astype(np.uint16)
    ids.tofile(out / "reference.bin")
    return len(ids)


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--copies", type=int, default=4, help="the clean corpus repeated for pack")
    parser.add_argument("--vocab-size", type=int, default=16000, help="of the tokenizer pack encodes with")
    args = parser.parse_args()
    corpus = Path(os.environ.get("CORPUS_DIR", ROOT.parent / "shared/data/corpus"))
    if not corpus.is_dir():
        sys.exit(f"error: CORPUS_DIR={corpus} is not a directory of real text")
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tempfile.gettempdir()}/bench-mlflow.db")
    workers = cpu_threads(0)
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
        params = yaml.safe_load((ROOT / "params.yaml").read_text())
        params["ingest"]["sources"] = {
            "real": {"path": str(corpus), "include": ["*.txt"], "split_by": "chunks", "max_doc_chars": 8000}
        }
        params["tokenizer"]["vocab_size"] = args.vocab_size
        Path("params.yaml").write_text(yaml.safe_dump(params))
        ingest.main(["real"])
        raw_mb = (
            sum(
                sum(len(t.encode()) for t in pq.read_table(p).column("text").to_pylist())
                for p in Path("data/raw/real").glob("*.parquet")
            )
            / 1e6
        )
        seconds, _ = median_time(clean_from_scratch, args.repeats)
        print(
            json.dumps(
                {
                    "measure": "clean",
                    "mb": round(raw_mb, 2),
                    "seconds": round(seconds, 3),
                    "mb_per_s": round(raw_mb / seconds, 2),
                    "near_dedup": True,
                    "workers": workers,
                }
            )
        )
        tokenizer.main()

        table = pa.concat_tables(pq.read_table(path) for path in clean_shards())
        big = Path("documents_x.parquet")
        pq.write_table(pa.concat_tables([table] * args.copies), big)
        cfg = load_params().pack
        out = Path("ours")
        model_file = "data/tokenizer/spm.model"
        out.mkdir()
        for sentences in (False, True):
            ours_cfg = cfg.model_copy(update={"sentences": sentences})
            results = {}
            for _ in range(args.repeats):  # alternate so both see the same machine state
                for name, run in (
                    ("ours", partial(ours_pack, big, Path(model_file), ours_cfg, out)),
                    ("reference", partial(reference_pack, big, model_file, workers, Path("."), sentences)),
                ):
                    start = time.perf_counter()
                    tokens = run()
                    results.setdefault(name, []).append((time.perf_counter() - start, tokens))
            tokens, ref_tokens = results["ours"][0][1], results["reference"][0][1]
            # with sentences the two split paragraphs apart differently: a few tokens differ
            assert sentences or tokens == ref_tokens, "ours and the reference packed different token counts"
            ours_s = statistics.median(t for t, _ in results["ours"])
            ref_s = statistics.median(t for t, _ in results["reference"])
            # ratio of each adjacent pair, so a drift in machine speed cancels out
            pair_ratios = [r[0] / o[0] for o, r in zip(results["ours"], results["reference"], strict=True)]
            print(
                json.dumps(
                    {
                        "measure": "pack_sentences" if sentences else "pack",
                        "tokens": tokens,
                        "ref_tokens": ref_tokens,
                        "workers": workers,
                        "ours_tokens_per_s": round(tokens / ours_s),
                        "ref_tokens_per_s": round(ref_tokens / ref_s),
                        "ratio": round(statistics.median(pair_ratios), 2),
                    }
                )
            )


if __name__ == "__main__":
    main()
