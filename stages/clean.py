"""Stage `clean`: normalise, filter by quality rules, drop exact and near duplicates.

`data/raw/*.parquet` -> `data/clean/documents.parquet` (id, source, text). Every dropped document is
counted against the first rule it breaks in `metrics/clean.json`; none is dropped silently.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import LeanMinHash, MinHashLSH

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
from stages.layout import CLEAN, CLEAN_METRICS, RAW
from stages.params import CleanParams, load_params
from stages.quality import RULES, exact_key, failed_rule, minhash_signature, normalize
from stages.schemas import DOCUMENTS, validate
from stages.tracking import stage_run

CHUNK = 256  # documents per task sent to a worker
Verdict = tuple[str, str, str, str | None, bytes, LeanMinHash | None]  # id, source, text, rule, key, sig

_worker_cfg: tuple[CleanParams, int] | None = None


def _init_worker(cfg: CleanParams, seed: int) -> None:
    global _worker_cfg
    _worker_cfg = (cfg, seed)


def judge(rows: list[tuple[str, str, str]]) -> list[Verdict]:
    """Per-document work: normalise, apply the rules, hash, and sign the documents that pass."""
    assert _worker_cfg is not None
    cfg, seed = _worker_cfg
    out = []
    for doc_id, source, raw in rows:
        text = normalize(raw)
        rule = failed_rule(text, cfg)
        key = exact_key(text) if rule is None else b""
        sig = minhash_signature(text, cfg, seed) if rule is None and cfg.near_dedup.enabled else None
        out.append((doc_id, source, text, rule, key, sig))
    return out


def raw_chunks(files: list[Path]) -> Iterator[list[tuple[str, str, str]]]:
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=CHUNK, columns=["id", "source", "text"]):
            yield list(zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True))


def clean_documents(
    files: list[Path], cfg: CleanParams, seed: int, workers: int
) -> tuple[Iterator[Verdict], Counter]:
    """Kept documents in input order, and the counters they are tallied in as the iterator runs."""
    counts: Counter = Counter()

    def kept() -> Iterator[Verdict]:
        seen: set[bytes] = set()
        lsh = (
            MinHashLSH(threshold=cfg.near_dedup.threshold, num_perm=cfg.near_dedup.num_perm)
            if cfg.near_dedup.enabled
            else None
        )
        total = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
        if workers > 1:
            pool = multiprocessing.get_context("spawn").Pool(workers, _init_worker, (cfg, seed))
            verdicts = pool.imap(judge, raw_chunks(files), chunksize=2)
        else:
            pool = None
            _init_worker(cfg, seed)
            verdicts = map(judge, raw_chunks(files))
        try:
            bar = progress(total=total, desc="clean", unit="doc")
            for chunk in verdicts:
                bar.update(len(chunk))
                for verdict in chunk:
                    doc_id, _, text, rule, key, sig = verdict
                    counts["documents_in"] += 1
                    if rule is None and cfg.exact_dedup:
                        rule = "exact_duplicate" if key in seen else None
                        seen.add(key)
                    if rule is None and lsh is not None:
                        if lsh.query(sig):
                            rule = "near_duplicate"
                        else:
                            lsh.insert(counts["documents_in"], sig)
                    if rule is None:
                        counts["documents_kept"] += 1
                        counts["characters_kept"] += len(text)
                        yield verdict
                    else:
                        counts[f"dropped.{rule}"] += 1
            bar.close()
        finally:
            if pool is not None:
                pool.terminate()

    return kept(), counts


def main() -> None:
    params = load_params()
    cfg = params.clean
    manifest = read_json(RAW / "manifest.json", "ingest")
    files = sorted(RAW.glob("*.parquet"))
    workers = cpu_threads(cfg.workers)
    with stage_run(
        "clean",
        params.tracking.experiment,
        {"seed": params.seed, "clean": cfg.model_dump()},
        {"data.synthetic": manifest["synthetic"]},
    ) as run:
        docs, counts = clean_documents(files, cfg, params.seed, workers)
        with atomic_dir(CLEAN) as tmp:
            schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("text", pa.string())])
            with pq.ParquetWriter(tmp / "documents.parquet", schema, compression="zstd") as writer:
                batch: list[tuple[str, str, str]] = []
                for doc_id, source, text, *_ in docs:
                    batch.append((doc_id, source, text))
                    if len(batch) >= 8192:
                        _write(writer, schema, batch, tmp)
                if batch:
                    _write(writer, schema, batch, tmp)
            dropped = {rule: counts[f"dropped.{rule}"] for rule in RULES}
            if counts["documents_kept"] == 0:
                raise StageError(
                    f"clean: no documents left after cleaning ({counts['documents_in']} in); "
                    "dropped by rule: " + ", ".join(f"{rule}={n}" for rule, n in dropped.items() if n)
                )
            write_json(tmp / "manifest.json", {**manifest, "documents": counts["documents_kept"]})
        report = {
            "documents_in": counts["documents_in"],
            "documents_kept": counts["documents_kept"],
            "characters_kept": counts["characters_kept"],
            "kept_fraction": round(counts["documents_kept"] / counts["documents_in"], 6),
            "dropped": dropped,
        }
        write_json(CLEAN_METRICS, report)
        run.log_metrics(report)
        log.info(
            "clean: kept %d of %d documents; dropped %s",
            counts["documents_kept"],
            counts["documents_in"],
            {rule: n for rule, n in dropped.items() if n},
        )


def _write(writer: pq.ParquetWriter, schema: pa.Schema, batch: list, tmp: Path) -> None:
    frame = validate(DOCUMENTS, pd.DataFrame(batch, columns=["id", "source", "text"]), str(tmp))
    writer.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False))
    batch.clear()


if __name__ == "__main__":
    run_main(main)
