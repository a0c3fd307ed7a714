"""RoBERTa's input formats from the packed tokens and `pack.sentences`' index: what each row holds, the
pair labels (BERT's next-sentence prediction, ALBERT's sentence order), segment embeddings, the pair
head's training and FLOPs, and the params that cannot work, one line each."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lmpipe.params.pretrain import PretrainParams, PretrainSections, objectives_params
from lmpipe.params.project import parse_params
from lmpipe.params.schema import parse
from lmpipe.pretraining import train_config
from lmpipe.runtime import StageError
from models.config import ModelConfig
from models.flops import estimate_step_flops
from models.input_formats import SentenceIndex, format_rows
from models.pretraining import PackedBatches, PretrainModule
from models.special import SPECIAL
from models.transformer import segment_ids
from tests.test_pairs import assert_learns
from tests.workdir import DEFAULT_PARAMS

CLS, SEP, EOS, PAD = SPECIAL.cls, SPECIAL.sep, SPECIAL.eos, SPECIAL.pad
SENTENCES_PER_DOC, DOCS = 6, 8


def packed(tmp_path: Path) -> tuple[np.ndarray, SentenceIndex]:
    """Documents of sentences whose tokens say where they are: 1000·(doc+1) + 10·sentence + position,
    3 to 5 tokens a sentence, the document's EOS after its last sentence."""
    tokens, sentence_starts, doc_starts = [], [], []
    rng = np.random.default_rng(0)
    for doc in range(DOCS):
        doc_starts.append(len(tokens))
        for sentence in range(SENTENCES_PER_DOC):
            sentence_starts.append(len(tokens))
            tokens += [1000 * (doc + 1) + 10 * sentence + i for i in range(rng.integers(3, 6))]
        tokens.append(EOS)
    array = np.array(tokens, dtype=np.uint16)
    array.tofile(tmp_path / "train.bin")
    np.array(sentence_starts, np.int64).tofile(tmp_path / "train.sentences.bin")
    np.array(doc_starts, np.int64).tofile(tmp_path / "train.documents.bin")
    return array, SentenceIndex(np.memmap(tmp_path / "train.bin", np.uint16, mode="r"), tmp_path, "train")


def where(token: int) -> tuple[int, int]:
    return token // 1000 - 1, token % 1000 // 10  # (document, sentence)


def segments(row: list[int]) -> tuple[list[int], list[int]]:
    assert row[0] == CLS and row.count(SEP) == 2
    first = row.index(SEP)
    return row[1:first], row[first + 1 : row.index(SEP, first + 1)]


def rows(index: SentenceIndex, fmt: str, loss: str, length: int = 40, n: int = 64, short: float = 0.0):
    generator = torch.Generator().manual_seed(0)
    return format_rows(index, fmt, loss, n, length, generator, short)


def test_doc_sentences_are_whole_sentences_of_one_document(tmp_path: Path) -> None:
    tokens, index = packed(tmp_path)
    batch = rows(index, "doc_sentences", "nsp", length=12)
    assert batch.pair_labels is None and batch.tokens.shape == (64, 12)
    for row, n in zip(batch.tokens.tolist(), batch.lengths.tolist(), strict=True):
        real = row[:n]
        assert all(t == PAD for t in row[n:])
        text = [t for t in real if t != EOS]
        assert len({where(t)[0] for t in text}) == 1  # one document
        assert text[0] % 10 == 0  # from a sentence's start
        if EOS in real:
            assert real[-1] == EOS and where(text[-1])[1] == SENTENCES_PER_DOC - 1
        start = int(np.flatnonzero(tokens == real[0])[0])
        assert tokens[start : start + n].tolist() == real  # contiguous


@pytest.mark.parametrize("fmt", ["segment_pair", "sentence_pair"])
def test_next_sentence_pairs_are_continuations_or_another_documents(tmp_path: Path, fmt: str) -> None:
    tokens, index = packed(tmp_path)
    batch = rows(index, fmt, "nsp", n=200)
    assert batch.tokens[:, 0].eq(CLS).all() and 60 < int(batch.pair_labels.sum()) < 140
    for row, label in zip(batch.tokens.tolist(), batch.pair_labels.tolist(), strict=True):
        a, b = segments(row)
        assert a and b and EOS not in a + b
        doc_a, doc_b = where(a[0])[0], where(b[0])[0]
        if label == 0:  # B is the text after A, in A's document
            assert doc_a == doc_b and where(b[0])[1] == where(a[-1])[1] + 1
        else:
            assert doc_a != doc_b
        if fmt == "sentence_pair":
            assert len({where(t)[1] for t in a}) == 1 and len({where(t)[1] for t in b}) == 1
        assert segment_ids(torch.tensor([row]))[0].tolist() == [0] * (len(a) + 2) + [1] * (
            len(row) - len(a) - 2
        )


def test_sentence_order_pairs_are_swapped_half_the_time(tmp_path: Path) -> None:
    _, index = packed(tmp_path)
    batch = rows(index, "segment_pair", "sop", n=200)
    assert 60 < int(batch.pair_labels.sum()) < 140
    for row, label in zip(batch.tokens.tolist(), batch.pair_labels.tolist(), strict=True):
        a, b = segments(row)
        if not b:  # a lone sentence at a document's end: an ordered pair with an empty B
            assert label == 0
            continue
        assert where(a[0])[0] == where(b[0])[0]  # one document, in order or swapped
        first, second = (a, b) if label == 0 else (b, a)
        assert where(second[0])[1] == where(first[-1])[1] + 1


def test_a_long_pair_loses_tokens_from_its_longer_segment(tmp_path: Path) -> None:
    _, index = packed(tmp_path)
    batch = rows(index, "segment_pair", "nsp", length=10, n=100)
    assert batch.tokens.shape == (100, 10) and (batch.tokens[:, -1] != PAD).any()
    for row in batch.tokens.tolist():
        a, b = segments([t for t in row if t != PAD])
        assert a and b and len(a) + len(b) <= 7
    again = rows(index, "segment_pair", "nsp", length=10, n=100)
    assert torch.equal(batch.tokens, again.tokens)  # a function of the generator's seed


def test_bert_short_rows_gather_fewer_sentences(tmp_path: Path) -> None:
    """`short_seq_prob` (BERT's 0.1; 1 here): rows gather sentences up to a random target in [2, the
    row's] and so hold fewer tokens, still pairs of A and B; a lone sentence gets a random B, as in
    BERT, so more of them are next-sentence negatives."""
    _, index = packed(tmp_path)
    full = rows(index, "segment_pair", "nsp", length=20, n=400)
    short = rows(index, "segment_pair", "nsp", length=20, n=400, short=1.0)
    assert short.lengths.float().mean() < full.lengths.float().mean() - 3
    assert int(full.pair_labels.sum()) < int(short.pair_labels.sum()) < 400
    for row in short.tokens.tolist():
        a, b = segments([t for t in row if t != PAD])
        assert a and b and len(a) + len(b) <= 17


def test_a_pair_format_trains_its_head_and_counts_its_flops(tmp_path: Path) -> None:
    packed(tmp_path)
    run = PretrainParams(seq_len=32, batch_size=8, input_format="segment_pair", warmup_steps=0)
    train = train_config("encoder", "mlm", run, objectives_params(), seed=1)
    model = ModelConfig(vocab_size=9000, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=32)
    model = model.with_(arch="encoder", segment_embeddings=True)
    (batch,) = PackedBatches(tmp_path / "train.bin", "uint16", train, 9000, 0, 1)
    assert set(batch) >= {"input_ids", "pad_mask", "positions", "labels", "pair_labels"}
    module = assert_learns(model, train, batch, steps=8)
    assert module.pair_head is not None and module.model.segments is not None
    assert module.terms(batch).extra["nsp"][0] < 0.69  # the pair loss below chance too
    plain = train_config("encoder", "mlm", PretrainParams(seq_len=32, batch_size=8), objectives_params(), 1)
    assert PretrainModule(model, plain).pair_head is None  # no pairs, no pair loss
    head = 3 * 8 * (2 * 32 * 32 + 2 * 32 * 2)
    assert estimate_step_flops(model, train) == estimate_step_flops(model, plain) + head


def test_tokens_seen_leaves_out_short_rows_padding_across_a_resume(tmp_path: Path) -> None:
    """The summary's `tokens_seen` is the rows' positions less their padding: counted per micro-batch
    in training, kept in the checkpoint, so a resumed run's count equals an unbroken one's."""
    packed(tmp_path)
    run = PretrainParams(
        seq_len=32, batch_size=8, input_format="segment_pair", short_seq_prob=0.5, warmup_steps=0
    )
    train = train_config("encoder", "mlm", run, objectives_params(), seed=1)
    model = ModelConfig(vocab_size=9000, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=32)
    model = model.with_(arch="encoder", segment_embeddings=True)

    def batches(start: int, stop: int) -> DataLoader:
        return DataLoader(PackedBatches(tmp_path / "train.bin", "uint16", train, 9000, start, stop), None)

    padding = sum(int((~batch["pad_mask"]).sum()) for batch in batches(0, 4))
    assert padding > 0

    def fit(module: PretrainModule, steps: int, loader: DataLoader, ckpt: Path | None = None) -> L.Trainer:
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(module, loader, ckpt_path=ckpt)
        return trainer

    first = PretrainModule(model, train)
    fit(first, 2, batches(0, 2)).save_checkpoint(tmp_path / "step2.ckpt")
    resumed = PretrainModule(model, train)
    fit(resumed, 4, batches(2, 4), tmp_path / "step2.ckpt")
    unbroken = PretrainModule(model, train)
    fit(unbroken, 4, batches(0, 4))
    assert resumed.padded_positions() == unbroken.padded_positions() == padding


def test_albert_trains_sentence_order_with_factorized_embeddings_and_one_shared_block(tmp_path: Path) -> None:
    """ALBERT's recipe in one model: SOP on segment pairs, E < d_model, every layer one block."""
    packed(tmp_path)
    run = PretrainParams(seq_len=32, batch_size=8, input_format="segment_pair", warmup_steps=0)
    args = objectives_params({"mlm": {"pair_loss": "sop"}})
    train = train_config("encoder", "mlm", run, args, seed=1)
    model = ModelConfig(vocab_size=9000, d_model=32, n_layers=3, n_heads=2, d_ff=64, max_len=32)
    model = model.with_(arch="encoder", segment_embeddings=True, embedding_size=16, share_layers="all")
    (batch,) = PackedBatches(tmp_path / "train.bin", "uint16", train, 9000, 0, 1)
    module = assert_learns(model, train, batch, steps=8)
    blocks = module.model.encoder.blocks
    assert blocks[0] is blocks[1] is blocks[2] and module.model.embed.weight.shape == (9000, 16)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"pretrain": {"input_format": "segment_pair"}},
            "pretrain.input_format: segment_pair reads where sentences start: set pack.sentences: true",
        ),
        (
            {"pretrain": {"short_seq_prob": 0.1}},
            "pretrain.short_seq_prob: short rows are drawn for segment pairs (BERT's), and "
            "pretrain.input_format is full_sentences (models.m)",
        ),
        (
            {"pretrain": {"input_format": "doc_sentences", "sampling": "epoch"}, "pack": {"sentences": True}},
            "pretrain.input_format: doc_sentences draws its rows of an objective that trains input formats "
            "(mlm) at random sentences (sampling random); pretrain.sampling is epoch",
        ),
    ],
)
def test_a_format_that_cannot_work_is_one_line(changes: dict, message: str) -> None:
    raw = {**DEFAULT_PARAMS, "models": {"m": {"arch": "encoder", "objective": "mlm", "preset": "tiny"}}}
    raw = {
        key: value | changes.get(key, {}) if isinstance(value, dict) else value for key, value in raw.items()
    }
    raw["finetune"] = {**raw["finetune"], "models": {}}
    with pytest.raises(StageError) as error:
        parse_params(raw)
    assert str(error.value).endswith(message) and "\n" not in str(error.value)


def test_a_pair_format_of_a_decoders_lm_is_one_line() -> None:
    sections = {
        "models": {"gpt": {"arch": "decoder", "objective": "clm", "preset": "tiny"}},
        "pretrain": {"input_format": "segment_pair"},
    }
    with pytest.raises(StageError) as error:
        parse(PretrainSections, sections)
    assert "models.gpt.objective is clm" in str(error.value)
