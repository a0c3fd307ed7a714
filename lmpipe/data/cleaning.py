"""What stage `clean` is made of: the quality rules per document on every core (or a cluster), then
exact and near deduplication over the whole corpus.

The per-document work (normalising, the rules, the exact keys and the MinHash signatures cut into LSH
bands) is kept per shard in a store (lmpipe/data/store.py), keyed by the shard's bytes: a corpus that
grows judges its new shards only. The decisions between documents are then taken again over every
shard's kept keys and bands (sorts and a union-find over files, cheap beside the signatures), so a new
document that duplicates an old one and comes first in the corpus drops the old one, as a run from
scratch would; a shard's output is kept too, keyed by its judged entry and what was decided, so only
the shards whose documents' fate changed are written again."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lmpipe.data import dedup
from lmpipe.data.parallel import map_unless_kept, shard_map
from lmpipe.data.progress import Meter
from lmpipe.data.quality import Words, exact_key, failed_rule, minhash_signature, normalize
from lmpipe.data.shards import Shard, shard_digests, shards_of
from lmpipe.data.store import StatMemo, Store, digest, link
from lmpipe.layout import CLEAN_STORE, CLEAN_WORK
from lmpipe.params.clean import CleanParams
from lmpipe.runtime import (
    atomic_file,
    log,
)
from lmpipe.schemas import DOCUMENT_COLUMNS, DOCUMENTS, DOCUMENTS_ARROW, validate


@dataclass(frozen=True)
class Job:
    """What every task of one run shares (sent to each worker)."""

    cfg: CleanParams
    seed: int
    bands: int
    band_rows: int
    store: Store  # the shards' judged documents and kept outputs by digest
    work: str  # this run's pairs and components (absolute: workers on a cluster run elsewhere)
    judged_keys: tuple[str, ...]  # each shard's entry of phase 1, by shard index

    def judged(self, shard: Shard) -> Path:
        return self.store.path(self.judged_keys[shard.index])


def judge(job: Job, shard: Shard) -> dict[str, int]:
    """Phase 1: normalise, apply the rules, and key and sign the documents that pass (their rows in the
    shard: where the shard sits in the corpus is not part of what is kept)."""
    key = job.judged_keys[shard.index]
    kept = job.store.get(key)
    if kept is not None:  # judged by an earlier run: the same documents, params and code
        return json.loads((kept / "counts.json").read_text())
    table = pq.ParquetFile(shard.path).read_row_group(shard.row_group, columns=DOCUMENT_COLUMNS)
    counts: Counter = Counter(documents_in=table.num_rows)
    kept_rows, rows, keys, signatures = [], [], [], []
    ids, sources, texts, metas = (table.column(column).to_pylist() for column in DOCUMENT_COLUMNS)
    for row, (doc_id, source, raw, meta) in enumerate(zip(ids, sources, texts, metas, strict=True)):
        counts["characters_in"] += len(raw)
        text = normalize(raw)
        words = Words(text)
        rule = failed_rule(text, job.cfg, words, meta)
        if rule is not None:
            counts[f"dropped.{rule}"] += 1
            counts[f"dropped_characters.{rule}"] += len(raw)
            continue
        kept_rows.append((doc_id, source, text, meta))
        rows.append(row)
        keys.append(np.frombuffer(exact_key(text), dtype=np.uint64))
        if job.cfg.near_dedup.enabled:
            signatures.append(minhash_signature(words, job.cfg, job.seed).hashvalues)

    with job.store.put(key) as tmp:
        frame = pd.DataFrame(kept_rows, columns=DOCUMENT_COLUMNS)
        kept_table = pa.Table.from_pandas(frame, schema=DOCUMENTS_ARROW, preserve_index=False)
        pq.write_table(kept_table, tmp / "kept.parquet")
        np.save(tmp / "rows.npy", np.array(rows, dtype=np.int64))
        np.save(tmp / "exact.npy", np.array(keys, dtype=np.uint64).reshape(-1, 2))
        if signatures:
            np.save(tmp / "bands.npy", dedup.band_hashes(np.stack(signatures), job.bands, job.band_rows))
        (tmp / "counts.json").write_text(json.dumps(dict(counts)))
    return dict(counts)


def pair_task(job: Job, shards: list[Shard], task: tuple[str, int, int, int]) -> str:
    """Phase 2: the duplicate pairs of one band (or of the exact keys) in one hash range."""
    kind, band, part, parts = task
    out = Path(job.work) / "pairs" / f"{kind}-{band:03d}-{part:04d}.npy"
    if out.exists():
        return str(out)
    keys, index = [], []
    for shard in shards:
        rows, exact_keys, bands = judged_arrays(job.judged(shard))
        shard_index = shard.offset + rows
        if not len(shard_index):
            continue
        if kind == "exact":
            values = exact_keys
            first = values[:, 0]
        else:
            values = first = np.asarray(bands[band])
        chosen = dedup.in_partition(first, part, parts)
        keys.append(values[chosen])
        index.append(shard_index[chosen])
    pairs = (
        dedup.run_pairs(np.concatenate(keys), np.concatenate(index)) if keys else np.empty((2, 0), np.int64)
    )
    with atomic_file(out, "wb") as handle:
        np.save(handle, pairs)
    return str(out)


@lru_cache(maxsize=256)
def judged_arrays(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A judged entry's rows, exact keys and (mapped, not read) LSH bands, loaded once per process for
    all its sorts and decisions (every one of them where a small corpus sorts in this process)."""
    bands = folder / "bands.npy"
    return (
        np.load(folder / "rows.npy"),
        np.load(folder / "exact.npy"),
        np.load(bands, mmap_mode="r") if bands.exists() else None,
    )


def keep(job: Job, out_dir: str, decision: tuple[Shard, str]) -> dict[str, int]:
    """Phase 4: the shard's documents that are the first of their duplicate component, kept in the store
    by its judged entry and these decisions (`key`), and linked into the outputs."""
    shard, key = decision
    folder = job.judged(shard)
    entry = job.store.get(key)
    if entry is None:
        _, first, is_exact = decided(job, shard)
        with job.store.put(key) as tmp:
            table = pq.read_table(folder / "kept.parquet").filter(pa.array(first, pa.bool_()))
            if table.num_rows:
                validate(DOCUMENTS, table.to_pandas(), str(tmp / "part.parquet"))
                pq.write_table(table, tmp / "part.parquet", compression="zstd")
            kept = {
                "documents_kept": table.num_rows,
                "characters_kept": sum(map(len, table.column("text").to_pylist())),
                "exact": int(is_exact.sum()),
                "near": int((~first & ~is_exact).sum()),
            }
            (tmp / "counts.json").write_text(json.dumps(kept))
        entry = job.store.path(key)
    if (entry / "part.parquet").exists():
        link(entry / "part.parquet", Path(out_dir) / f"part-{shard.index:06d}.parquet")
    return {**json.loads((entry / "counts.json").read_text()), "key": key}


def decided(job: Job, shard: Shard) -> tuple[str, np.ndarray, np.ndarray]:
    """What was decided of the shard's documents that passed the rules (is each its component's first;
    is it an exact copy) and the key of its output: its judged entry and these decisions."""
    index = shard.offset + judged_arrays(job.judged(shard))[0]
    root = np.load(Path(job.work) / "root.npy", mmap_mode="r")
    exact = np.load(Path(job.work) / "exact_duplicate.npy", mmap_mode="r")
    first = np.asarray(root[index]) == index
    is_exact = np.asarray(exact[index]).astype(bool)
    flags = [np.packbits(flags).tobytes().hex() for flags in (first, is_exact)]
    return digest("kept", job.judged_keys[shard.index], len(index), *flags), first, is_exact


def clean(
    files: list[Path], cfg: CleanParams, seed: int, workers: int, scheduler: str | None, out: Path
) -> Counter:
    """Every phase; the kept documents go to `out` as part-*.parquet. Returns the counts."""
    bands, band_rows = dedup.lsh_params(cfg.near_dedup.threshold, cfg.near_dedup.num_perm)
    config = {"clean": cfg.model_dump(exclude={"workers"}), "seed": seed}
    store = Store(CLEAN_STORE, "clean", config, "stages.clean").open()
    shards = shards_of(files)
    contents = shard_digests(files, StatMemo(store, "shard-digests.json"))
    judged_keys = tuple(digest("judged", contents[s.path, s.row_group]) for s in shards)
    shutil.rmtree(CLEAN_WORK, ignore_errors=True)  # this run's pairs: cheap to find again
    CLEAN_WORK.mkdir(parents=True)
    job = Job(cfg, seed, bands, band_rows, store, str(CLEAN_WORK.resolve()), judged_keys)
    judged = [store.path(key).is_dir() for key in judged_keys]
    done = sum(judged)
    if done:
        what = "shards judged by an earlier run; judging"
        log.info("clean: %d of %d %s %d", done, len(shards), what, len(shards) - done)
    counts: Counter = Counter()
    meter = Meter("clean", total_docs=sum(s.rows for s in shards))
    for shard_counts in map_unless_kept(partial(judge, job), shards, judged, workers, scheduler, "clean"):
        counts.update(shard_counts)
        dropped = sum(v for k, v in shard_counts.items() if k.startswith("dropped."))
        meter.update(shard_counts["documents_in"], shard_counts.get("characters_in", 0), dropped)
    meter.close()

    passed = counts["documents_in"] - sum(v for k, v in counts.items() if k.startswith("dropped."))
    parts = dedup.partitions(passed)
    tasks = [("exact", 0, p, parts) for p in range(parts)] if cfg.exact_dedup else []
    if cfg.near_dedup.enabled:
        tasks += [("band", b, p, parts) for b in range(bands) for p in range(parts)]
    # the sorts of a small corpus take less than starting worker processes: then they run here
    spread = passed > dedup.PART_DOCS // 4
    pair_workers, pair_scheduler = (workers, scheduler) if spread else (1, None)
    pair_task_of_job = partial(pair_task, job, shards)
    pair_files = list(shard_map(pair_task_of_job, tasks, pair_workers, pair_scheduler, "clean"))
    log.info("clean: duplicate pairs from %d sorts (%d bands, %d hash range(s))", len(tasks), bands, parts)

    work = Path(job.work)
    total = counts["documents_in"]
    exact = np.lib.format.open_memmap(work / "exact_duplicate.npy", "w+", np.uint8, (total,))
    for path in pair_files:
        if Path(path).name.startswith("exact-"):
            exact[np.load(path)[1]] = 1
    exact.flush()
    dedup.components(work / "root.npy", total, map(Path, pair_files))

    used = list(judged_keys)
    decisions = [(shard, decided(job, shard)[0]) for shard in shards]
    outputs = [store.path(key).is_dir() for _, key in decisions]
    keep_shard = partial(keep, job, str(out.resolve()))
    for kept in map_unless_kept(keep_shard, decisions, outputs, workers, scheduler, "clean"):
        used.append(kept["key"])
        counts.update(
            {
                "documents_kept": kept["documents_kept"],
                "characters_kept": kept["characters_kept"],
                "dropped.exact_duplicate": kept["exact"],
                "dropped.near_duplicate": kept["near"],
            }
        )
    store.keep_only(used)  # what a rerun on these inputs needs stays
    judged_arrays.cache_clear()  # (their files may be gone)
    return counts
