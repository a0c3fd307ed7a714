"""`tokenizer`: fixed special ids, determinism, round trip, and the too-small-corpus error."""

from __future__ import annotations

import json
import unicodedata

import pytest
import sentencepiece as spm

from lmpipe.runtime import StageError
from models.pieces import piece_tables
from models.special import SPECIAL_IDS
from tests.pipeline_helpers import clean_texts, prepared, run_stages


def processor(workdir) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(workdir.path / "data/tokenizer/spm.model"))


def test_special_ids_are_fixed_and_recorded(sample_pipeline) -> None:
    sp = processor(sample_pipeline)
    meta = json.loads((sample_pipeline.path / "data/tokenizer/tokenizer.json").read_text())
    assert meta["special_ids"] == SPECIAL_IDS
    assert [sp.id_to_piece(i) for i in range(7)] == [
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
        "[CLS]",
        "[SEP]",
        "[MASK]",
    ]
    assert [sp.id_to_piece(i) for i in (7, 106)] == ["<extra_id_0>", "<extra_id_99>"]
    assert meta["mask_id"] == 6 and meta["sentinel_ids"] == [7, 106] and meta["eos_id"] == 3
    assert meta["vocab_size"] == sp.get_piece_size() == sample_pipeline.params["tokenizer"]["vocab_size"]
    assert meta["synthetic"] is True
    # specials are control symbols: the literal text never becomes one
    assert not set(sp.encode("[MASK] <extra_id_3> [CLS]")) & set(range(107))


def test_same_params_same_model(sample_pipeline, tmp_path) -> None:
    again = prepared(tmp_path, None)
    first = (sample_pipeline.path / "data/tokenizer/spm.model").read_bytes()
    assert (again.path / "data/tokenizer/spm.model").read_bytes() == first
    assert (again.path / "data/tokens/train.bin").read_bytes() == (
        sample_pipeline.path / "data/tokens/train.bin"
    ).read_bytes()


def test_bpe(sample_pipeline, tmp_path) -> None:
    bpe = prepared(tmp_path, None, tokenizer__model_type="bpe", tokenizer__vocab_size=800)
    sp = processor(bpe)
    assert sp.get_piece_size() == 800 and sp.piece_to_id("[MASK]") == 6
    doc = "The dordis trellais every varvou."
    assert sp.decode(sp.encode(doc)) == doc


def test_vocab_too_large_for_corpus_says_what_it_supports(sample_pipeline) -> None:
    with sample_pipeline.changed({"tokenizer.vocab_size": 50_000}), pytest.raises(StageError) as info:
        run_stages(sample_pipeline, "tokenizer")
    message = str(info.value)
    assert message.startswith("tokenizer.vocab_size=50000 is too large for this corpus: it supports at most ")
    assert "lower tokenizer.vocab_size or add text" in message and "trainer_interface" not in message


def test_round_trip_on_real_documents(real_pipeline) -> None:
    sp = processor(real_pipeline)
    docs = clean_texts(real_pipeline.path)
    assert len(docs) > 500
    for doc in docs:
        # nmt_nfkc: NFKC and whitespace runs (newlines included) become one space
        assert sp.decode(sp.encode(doc)) == " ".join(unicodedata.normalize("NFKC", doc).split())


def test_piece_tables_mark_word_starts_and_sentence_ends(sample_pipeline) -> None:
    """What whole-word masking and BART's sentence permutation read: ▁ pieces begin a word; full
    stops, question and exclamation marks end a sentence; the specials (a document's end) do both."""
    sp = processor(sample_pipeline)
    tables = piece_tables(sample_pipeline.path / "data/tokenizer/spm.model", ["sentence_ends", "word_starts"])
    ends, starts = tables["sentence_ends"], tables["word_starts"]
    assert len(ends) == len(starts) == sp.get_piece_size() and ends[:107].all() and starts[:107].all()
    ids = sp.encode("the cat sat. did it? yes!")  # ? and ! are byte-fallback pieces here
    assert sp.decode([i for i in ids if ends[i]]).replace(" ", "") == ".?!"
    assert [sp.id_to_piece(i).startswith("▁") for i in ids] == [bool(starts[i]) for i in ids]
