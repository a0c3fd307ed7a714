"""`pack`: flat memmap-readable shards, EOS per document, seeded document split, recorded metadata."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from lmpipe.data.packing import token_dtype, val_mask
from lmpipe.layout import clean_shards
from lmpipe.runtime import StageError
from tests.pipeline_helpers import clean_texts, run_stages
from tests.texts import prose
from tests.workdir import Workdir


@pytest.fixture(params=["sample_pipeline", "real_pipeline"])
def packed(request):
    return request.getfixturevalue(request.param)


def shards(workdir) -> tuple[dict, dict[str, np.ndarray]]:
    meta = json.loads((workdir.path / "data/tokens/meta.json").read_text())
    arrays = {
        s: np.memmap(workdir.path / f"data/tokens/{s}.bin", dtype=meta["dtype"], mode="r")
        for s in ("train", "val")
    }
    return meta, arrays


def test_shards_hold_every_clean_document_once(packed) -> None:
    meta, arrays = shards(packed)
    sp = spm.SentencePieceProcessor(model_file=str(packed.path / "data/tokenizer/spm.model"))
    tok_meta = json.loads((packed.path / "data/tokenizer/tokenizer.json").read_text())
    docs = clean_texts(packed.path)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == sp.get_piece_size()
    assert meta["tokenizer_sha256"] == tok_meta["sha256"]
    decoded = []
    for split, ids in arrays.items():
        assert len(ids) == meta[split]["tokens"]
        assert int((ids == meta["eos_id"]).sum()) == meta[split]["documents"]
        assert ids[-1] == meta["eos_id"] and int(ids.max()) < meta["vocab_size"]
        ends = np.flatnonzero(ids == meta["eos_id"])
        decoded += [sp.decode(part.tolist()) for part in np.split(np.asarray(ids), ends + 1)[:-1]]
    assert meta["train"]["documents"] + meta["val"]["documents"] == len(docs)
    assert sorted(decoded) == sorted(sp.decode(sp.encode(d)) for d in docs)
    val = meta["val"]["documents"]  # each document drawn on its own: about the fraction
    assert 0 < val < len(docs) and abs(val - len(docs) * meta["val_fraction"]) < 4 * len(docs) ** 0.5


def test_split_is_seeded(sample_pipeline) -> None:
    packed = sample_pipeline
    _, arrays = shards(packed)
    with packed.changed({"seed": 99}):
        run_stages(packed, "pack")
        _, reseeded = shards(packed)
        assert not np.array_equal(np.asarray(reseeded["val"]), np.asarray(arrays["val"]))
    run_stages(packed, "pack")
    _, again = shards(packed)
    assert np.array_equal(np.asarray(again["val"]), np.asarray(arrays["val"]))


def test_val_mask_and_dtype() -> None:
    ids = [f"src/doc.txt#{i}" for i in range(20_000)]
    mask = val_mask(ids, 0.05, 1)
    assert abs(mask.mean() - 0.05) < 0.005
    # a document's split is its own: other documents around it, before or after, never move it
    grown = val_mask(["new#0", *ids[:7000], "new#1", *ids[7000:]], 0.05, 1)
    assert np.array_equal(grown[1:7001], mask[:7000]) and np.array_equal(grown[7002:], mask[7000:])
    assert not np.array_equal(val_mask(ids, 0.05, 2), mask)  # and seeded
    # at least one document in each split, however small the corpus
    assert val_mask(ids[:2], 0.01, 0).sum() == 1
    assert val_mask(ids[:10], 0.99, 0).sum() == 9
    with pytest.raises(StageError, match="a train/val split needs at least 2"):
        val_mask(ids[:1], 0.5, 0)
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def documents(workdir: Workdir, split: str) -> Counter[str]:
    meta, arrays = shards(workdir)
    sp = spm.SentencePieceProcessor(model_file=str(workdir.path / "data/tokenizer/spm.model"))
    ids = np.asarray(arrays[split])
    ends = np.flatnonzero(ids == meta["eos_id"])
    return Counter(sp.decode(part.tolist()) for part in np.split(ids, ends + 1)[:-1])


def with_extra_source(tmp_path, files: int, paragraphs: int, words: int, split_by: str) -> Workdir:
    """The sample project with a second ingest source, `extra`: files of prose paragraphs."""
    workdir = Workdir(tmp_path)
    run_stages(workdir, "sample")
    extra = tmp_path / "extra"
    extra.mkdir()
    for i in range(files):
        text = "\n\n".join(prose(100 * i + j, words) for j in range(paragraphs))
        (extra / f"{i}.txt").write_text(text)
    sample = workdir.params["ingest"]["sources"]["sample"]
    workdir.sources(sample=sample, extra={"path": "extra", "include": ["*.txt"], "split_by": split_by})
    return workdir


def test_a_repeated_source_is_copied_into_the_training_tokens_only(tmp_path) -> None:
    workdir = with_extra_source(tmp_path, files=6, paragraphs=5, words=120, split_by="paragraphs")
    run_stages(workdir, "ingest", "clean", "tokenizer", "pack")
    once_meta, _ = shards(workdir)
    once = {split: documents(workdir, split) for split in ("train", "val")}

    workdir.set("pack.repeat", {"extra": 3})
    run_stages(workdir, "pack")
    meta, _ = shards(workdir)
    sources = meta["sources"]
    assert meta["repeat"] == {"extra": 3} and sources == once_meta["sources"]  # counted once
    assert set(sources) == {"sample", "extra"} and sources["extra"]["documents"] > 0
    assert sum(s["documents"] for s in sources.values()) == meta["train"]["documents"]
    assert sum(s["tokens"] for s in sources.values()) == once_meta["train"]["tokens"]
    assert meta["train"]["tokens"] == once_meta["train"]["tokens"] + 2 * sources["extra"]["tokens"]
    assert meta["val"] == once_meta["val"] and documents(workdir, "val") == once["val"]
    train = documents(workdir, "train")
    copied = train - once["train"]
    assert sum(copied.values()) == 2 * sources["extra"]["documents"]
    assert all(train[doc] == 3 * once["train"][doc] for doc in copied)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "data/tokenizer/spm.model"))
    clean = [
        row
        for shard in clean_shards(tmp_path / "data/clean")
        for row in pq.read_table(shard, columns=["text", "source"]).to_pylist()
    ]
    extra_texts = {sp.decode(sp.encode(row["text"])) for row in clean if row["source"] == "extra"}
    assert set(copied) == extra_texts - set(once["val"])


def test_sentence_pieces_join_back_into_the_text() -> None:
    from lmpipe.data.packing import sentence_pieces

    text = "Mr. Smith went to Washington. He said, e.g., it was big!\n\nChapter II\n \nIt rained. "
    text += "Ünïcödé façade."
    pieces = sentence_pieces(text)
    assert "".join(pieces) == text
    assert [p.strip() for p in pieces] == [
        "Mr. Smith went to Washington.",
        "He said, e.g., it was big!",
        "Chapter II",  # a paragraph break ends a sentence, a heading's too
        "It rained.",
        "Ünïcödé façade.",
    ]
    assert sentence_pieces("one unpunctuated line") == ["one unpunctuated line"]


def test_sentences_keep_where_documents_and_sentences_start(tmp_path) -> None:
    """With `pack.sentences`, the documents read as without it, and the index beside the tokens says
    where each document and sentence starts, for the repeated copies too; without it, no index."""
    workdir = with_extra_source(tmp_path, files=3, paragraphs=4, words=60, split_by="file")
    workdir.set("pack.repeat", {"extra": 2})
    run_stages(workdir, "ingest", "clean", "tokenizer", "pack")
    whole = {split: documents(workdir, split) for split in ("train", "val")}
    assert not list((tmp_path / "data/tokens").glob("*.sentences.bin"))

    workdir.set("pack.sentences", True)
    run_stages(workdir, "pack")
    meta, arrays = shards(workdir)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "data/tokenizer/spm.model"))
    for split in ("train", "val"):
        assert documents(workdir, split) == whole[split]  # the same texts, sentence by sentence
        ids = np.asarray(arrays[split])
        doc_starts = np.fromfile(tmp_path / f"data/tokens/{split}.documents.bin", np.int64)
        sentence_starts = np.fromfile(tmp_path / f"data/tokens/{split}.sentences.bin", np.int64)
        eos = np.flatnonzero(ids == meta["eos_id"])
        assert doc_starts.tolist() == [0, *(eos[:-1] + 1).tolist()]  # copies included
        assert (
            len(doc_starts)
            == meta[split]["documents"] + (split == "train") * meta["sources"]["extra"]["documents"]
        )
        assert len(sentence_starts) == meta[split]["sentences"] > 2 * len(doc_starts)
        assert np.all(np.diff(sentence_starts) > 0) and set(doc_starts) <= set(sentence_starts)
        sentences = [sp.decode(part.tolist()) for part in np.split(ids, sentence_starts[1:])]
        assert all(len(s.split()) < 60 for s in sentences[:200])  # sentences, not paragraphs
        assert sum(s.rstrip().endswith((".", "!", "?")) for s in sentences) > 0.7 * len(sentences)

    # the pretrain stage reads BERT's segment pairs from that index, its validation too
    workdir.set("models", {"bert": {"arch": "encoder", "objective": "mlm", "preset": "tiny"}})
    workdir.set("pretrain.input_format", "segment_pair")
    workdir.set("pretrain.max_steps", 4)
    workdir.set("pretrain.warmup_steps", 0)
    workdir.set("pretrain.val_every", 4)
    workdir.set("finetune.models", {})
    run_stages(workdir, "pretrain", "bert")
    metrics = json.loads((tmp_path / "metrics/pretrain/bert.json").read_text())
    assert (
        metrics["steps"] == 4 and np.isfinite(metrics["val_loss"]) and 0 <= metrics["val_nsp_accuracy"] <= 1
    )
