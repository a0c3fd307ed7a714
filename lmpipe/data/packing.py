"""Encoding the clean documents into flat token arrays, shard by shard and resumable: stage `pack`."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import TypeVar

import blingfire
import numpy as np
import pyarrow.parquet as pq
import sentencepiece as spm

from lmpipe.data.draws import document_draws
from lmpipe.data.parallel import map_unless_kept
from lmpipe.data.progress import Meter
from lmpipe.data.shards import Shard, shard_digests, shards_of
from lmpipe.data.store import StatMemo, Store, digest
from lmpipe.layout import PACK_STORE
from lmpipe.params.pack import PackParams
from lmpipe.runtime import (
    StageError,
    cpu_threads,
    log,
    sha256_file,
)

SPLITS = ("train", "val")
# with pack.sentences, beside each split's tokens: where its documents and its sentences start (int64
# token offsets into <split>.bin, ascending)
DOCUMENTS, SENTENCES = ".documents.bin", ".sentences.bin"


POOL_DOCS = 200_000  # from this many documents on, a process per core (or a cluster) encodes the shards


T = TypeVar("T")


R = TypeVar("R")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def val_mask(ids: list[str], val_fraction: float, seed: int) -> np.ndarray:
    """True for the documents of the validation split: those whose draw (from the id and the seed
    alone, so that a document added later never moves another) is below `val_fraction`. A corpus so
    small that the draws put none in validation (or all) gives its lowest draw to validation (its
    highest to training): at least one each."""
    if len(ids) < 2:
        raise StageError(f"pack: {len(ids)} clean document(s); a train/val split needs at least 2")
    draws = document_draws(ids, seed, "val")
    mask = draws < val_fraction
    if not mask.any():
        mask[np.argmin(draws)] = True
    elif mask.all():
        mask[np.argmax(draws)] = False
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


PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def sentence_pieces(text: str) -> list[str]:
    """The text cut where its sentences start, the pieces joining back into it: where blingfire's
    rule-based splitter (the kind BERT's data creation used) ends a sentence, and at paragraph breaks.
    blingfire returns the sentences with newlines as spaces and the whitespace between them trimmed,
    so each is found in the text so spaced, from where the last one ended (its offsets API converts
    offsets in Python, 4x slower)."""
    spaced = text.replace("\n", " ")
    firsts, cursor = {0}, 0
    for sentence in blingfire.text_to_sentences(text).split("\n"):
        found = spaced.find(sentence, cursor)
        if found >= 0:
            firsts.add(found)
            cursor = found + len(sentence)
    firsts.update(b.end() for b in PARAGRAPH_BREAK.finditer(text) if b.end() < len(text))
    bounds = [*sorted(firsts), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def encode_sentences(
    processor: spm.SentencePieceProcessor, dtype: np.dtype, texts: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`encode_batch`'s ids and document lengths, each document encoded sentence by sentence; and each
    sentence's length (a document's EOS counted in its last) and each document's number of them. The
    ids are whole-document encoding's but where a piece's edge moves a token boundary."""
    pieces = [sentence_pieces(text) for text in texts]
    encoded = processor.encode([p for doc in pieces for p in doc], out_type=int, num_threads=1)
    piece_lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    ids = np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=int(piece_lengths.sum()))
    piece_document = np.repeat(np.arange(len(texts)), [len(doc) for doc in pieces])
    kept = piece_lengths > 0  # a piece of whitespace alone encodes to nothing: no sentence
    sentence_lengths, sentence_document = piece_lengths[kept], piece_document[kept]
    per_document = np.bincount(sentence_document, minlength=len(texts))
    tokens = np.bincount(sentence_document, weights=sentence_lengths, minlength=len(texts)).astype(np.int64)
    ids = np.insert(ids, np.cumsum(tokens), processor.eos_id())  # each document's EOS after its tokens
    ends = np.cumsum(per_document)
    sentence_lengths[ends[per_document > 0] - 1] += 1  # the EOS, in the document's last sentence
    empty = np.flatnonzero(per_document == 0)  # a document of nothing but its EOS: one sentence
    sentence_lengths = np.insert(sentence_lengths, ends[empty], 1)
    per_document[empty] = 1
    return ids, tokens + 1, sentence_lengths, per_document


def starts(lengths: np.ndarray, at: int) -> np.ndarray:
    """Where each of these back-to-back spans starts, the first at `at`."""
    return at + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths


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


@dataclass(frozen=True)
class Job:
    """What every task of one run shares (sent to each worker)."""

    model_file: str
    dtype: str
    threads: int  # encoding threads in a task: every core in this process, one in a pool's worker
    batch_documents: int
    store: Store  # the shards' tokens by digest (absolute: workers on a cluster run elsewhere)
    repeat: dict[str, int]  # a source's copies in train.bin (pack.repeat); others once
    sentences: bool  # pack.sentences: documents encoded sentence by sentence, their starts indexed


@cache
def _processor(model_file: str) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=model_file)


def encode_shard(job: Job, task: tuple[Shard, np.ndarray, str]) -> dict:
    """A shard's tokens by split (each document's `is_val` flag) into the store's entry `key`, whole or
    not at all, and its training documents and tokens by source (each counted once). A repeated source's
    training documents follow the shard's tokens again, `repeat - 1` more times, so that a sequential
    pass meets a copy a shard later, not straight after the original. SentencePiece releases the GIL
    while it encodes, so small batches on a thread pool keep every core busy, also while another
    thread turns ids into arrays."""
    shard, is_val, key = task
    kept = job.store.get(key)
    if kept is not None:  # encoded by an earlier run: the same documents, split, tokenizer and params
        return json.loads((kept / "counts.json").read_text())
    encoder = encode_sentences if job.sentences else encode_batch
    encode = partial(encoder, _processor(job.model_file), np.dtype(job.dtype))
    counts = {split: {"documents": 0, "tokens": 0} for split in SPLITS}
    if job.sentences:
        for split in SPLITS:
            counts[split]["sentences"] = 0
    sources: dict[str, dict[str, int]] = {}
    # a repeated training document's ids, its repeat and its sentences' lengths
    copies: list[tuple[np.ndarray, int, np.ndarray]] = []
    start = 0
    with pq.ParquetFile(shard.path) as table_file, job.store.put(key) as tmp:
        batches = table_file.iter_batches(
            batch_size=job.batch_documents, row_groups=[shard.row_group], columns=["text", "source"]
        )
        columns = ((b.column(0).to_pylist(), b.column(1).to_pylist()) for b in batches)
        encoded = ordered_map(lambda c: (encode(c[0]), c[1]), columns, job.threads)
        with contextlib.ExitStack() as files:
            handles = {
                (split, kind): files.enter_context(open(tmp / f"{split}{kind}", "wb"))
                for split in SPLITS
                for kind in (".bin", *((DOCUMENTS, SENTENCES) if job.sentences else ()))
            }
            for (ids, lengths, *sentences), doc_sources in encoded:
                doc_is_val = is_val[start : start + len(lengths)]
                start += len(lengths)
                token_is_val = np.repeat(doc_is_val, lengths)
                for split, picked, docs in (
                    ("train", ~token_is_val, ~doc_is_val),
                    ("val", token_is_val, doc_is_val),
                ):
                    chosen = ids[picked]
                    if job.sentences:  # where the chosen documents and sentences start in the split
                        sentence_lengths, per_document = sentences
                        at = counts[split]["tokens"]
                        starts(lengths[docs], at).tofile(handles[split, DOCUMENTS])
                        kept = sentence_lengths[np.repeat(docs, per_document)]
                        starts(kept, at).tofile(handles[split, SENTENCES])
                        counts[split]["sentences"] += len(kept)
                    chosen.tofile(handles[split, ".bin"])
                    counts[split]["documents"] += int(docs.sum())
                    counts[split]["tokens"] += len(chosen)
                ends = np.cumsum(lengths)
                sentence_ends = np.cumsum(sentences[1]) if job.sentences else None
                for doc, (source, end, length) in enumerate(zip(doc_sources, ends, lengths, strict=True)):
                    if doc_is_val[doc]:
                        continue
                    tally = sources.setdefault(source, {"documents": 0, "tokens": 0})
                    tally["documents"] += 1
                    tally["tokens"] += int(length)
                    if job.repeat.get(source, 1) > 1:
                        own = np.empty(0, np.int64)
                        if job.sentences:
                            own = sentences[0][sentence_ends[doc] - sentences[1][doc] : sentence_ends[doc]]
                        copies.append((ids[end - length : end], job.repeat[source], own))
            for copy in range(1, max((times for _, times, _ in copies), default=1)):
                for doc_ids, times, sentence_lengths in copies:
                    if times > copy:
                        if job.sentences:
                            at = counts["train"]["tokens"]
                            np.array([at], np.int64).tofile(handles["train", DOCUMENTS])
                            starts(sentence_lengths, at).tofile(handles["train", SENTENCES])
                            counts["train"]["sentences"] += len(sentence_lengths)
                        doc_ids.tofile(handles["train", ".bin"])
                        counts["train"]["tokens"] += len(doc_ids)
        counts["sources"] = sources
        (tmp / "counts.json").write_text(json.dumps(counts))
    return counts


def pack(
    documents: list[Path], model_file: Path, cfg: PackParams, seed: int, scheduler: str | None, out_dir: Path
) -> dict:
    """Every shard encoded (in this process on all cores, on a process pool for a large corpus, or on a
    Dask cluster) unless the store keeps its tokens from an earlier run, then the shards' tokens
    concatenated in corpus order. A shard's entry is keyed by its documents' bytes and split: a
    corpus that grows encodes its new shards only. Returns each split's documents and tokens (train's
    tokens with the repeated sources' copies), and the training documents and tokens of each source,
    counted once."""
    vocab_size = _processor(str(model_file.resolve())).get_piece_size()
    shards = shards_of(documents)
    n_docs = sum(s.rows for s in shards)
    is_val = val_mask(document_ids(shards), cfg.val_fraction, seed)
    cores = cpu_threads(cfg.threads)
    spread = scheduler is not None or n_docs > POOL_DOCS  # a pool's start-up costs more on less
    workers, threads = (cores, 1) if spread else (1, cores)
    dtype = token_dtype(vocab_size).name
    shaping = cfg.model_dump(exclude={"threads", "batch_documents"})  # these change no byte
    config = {"pack": shaping, "seed": seed, "tokenizer_sha256": sha256_file(model_file)}
    store = Store(PACK_STORE, "pack", config, "stages.pack").open()
    model = str(model_file.resolve())
    job = Job(model, dtype, threads, cfg.batch_documents, store, cfg.repeat, cfg.sentences)
    contents = shard_digests(documents, StatMemo(store, "shard-digests.json"))
    tasks = []
    for shard in shards:
        mask = is_val[shard.offset : shard.offset + shard.rows]
        key = digest(contents[shard.path, shard.row_group], np.packbits(mask).tobytes().hex())
        tasks.append((shard, mask, key))
    encoded = [store.path(key).is_dir() for _, _, key in tasks]
    kept = sum(encoded)
    if kept:
        what = "shards kept from an earlier run; encoding"
        log.info("pack: %d of %d %s %d", kept, len(tasks), what, len(tasks) - kept)
    tallied = ("documents", "tokens", "sentences") if cfg.sentences else ("documents", "tokens")
    counts: dict = {split: dict.fromkeys(tallied, 0) for split in SPLITS}
    sources: dict[str, dict[str, int]] = {}
    meter = Meter("pack", total_docs=n_docs)
    results = map_unless_kept(partial(encode_shard, job), tasks, encoded, workers, scheduler, "pack")
    split_tokens = []  # each shard's tokens by split: where its index offsets start in the whole
    for shard, shard_counts in zip(shards, results, strict=True):
        split_tokens.append({split: shard_counts[split]["tokens"] for split in SPLITS})
        for split in SPLITS:
            for key in tallied:
                counts[split][key] += shard_counts[split][key]
        for source, tally in shard_counts["sources"].items():
            total = sources.setdefault(source, {"documents": 0, "tokens": 0})
            for key in ("documents", "tokens"):
                total[key] += tally[key]
        meter.update(docs=shard.rows)
    meter.close()
    entries = [store.path(key) for _, _, key in tasks]
    for split in SPLITS:
        with open(out_dir / f"{split}.bin", "wb") as out:
            for entry in entries:
                with open(entry / f"{split}.bin", "rb") as part:
                    shutil.copyfileobj(part, out, 16 << 20)
        for index in (DOCUMENTS, SENTENCES) if cfg.sentences else ():
            with open(out_dir / f"{split}{index}", "wb") as out:
                at = 0  # a shard's offsets are into its own tokens: shifted by the shards before it
                for entry, tokens in zip(entries, split_tokens, strict=True):
                    (np.fromfile(entry / f"{split}{index}", np.int64) + at).tofile(out)
                    at += tokens[split]
    counts["sources"] = dict(sorted(sources.items()))
    store.keep_only(key for _, _, key in tasks)  # what a rerun on these inputs needs stays
    return counts


def document_ids(shards: list[Shard]) -> list[str]:
    """Every document's id, in corpus order."""
    ids: list[str] = []
    for shard in shards:
        with pq.ParquetFile(shard.path) as table_file:
            ids += table_file.read_row_group(shard.row_group, columns=["id"]).column(0).to_pylist()
    return ids
