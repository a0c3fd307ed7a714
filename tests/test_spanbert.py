"""SpanBERT's masking (whole words, geometric spans, 80/10/10 per span) and its span-boundary objective:
the spans as the paper draws them, the boundary states and offsets each masked token reads, the head
training beside the masked LM with its FLOPs counted, the stage reading the tokenizer's word starts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.objectives.base import batch_generator
from models.objectives.spanbert import geometric_lengths, mask_spans, word_starts_of
from models.pretraining import make_batch
from models.special import SPECIAL
from tests.pipeline_helpers import run_stages
from tests.test_pairs import assert_learns
from tests.test_params import assert_params_error
from tests.workdir import Workdir

VOCAB = 1000
TABLE = torch.zeros(VOCAB, dtype=torch.bool)
TABLE[::3] = True  # every third piece starts a word: words of 1 to a few pieces


def rows(n: int = 64, width: int = 128, seed: int = 0) -> torch.Tensor:
    tokens = torch.randint(
        SPECIAL.n_special, VOCAB, (n, width), generator=torch.Generator().manual_seed(seed)
    )
    tokens[:, 50] = SPECIAL.eos  # a document boundary inside each row
    return tokens


def test_geometric_span_lengths_are_spanberts() -> None:
    lengths = geometric_lengths(0.2, 10)
    assert len(lengths) == 10 and sum(lengths) == pytest.approx(1.0)
    assert sum((k + 1) * p for k, p in enumerate(lengths)) == pytest.approx(3.8, abs=0.01)  # the paper's mean


@pytest.mark.parametrize("unit", ["word", "span"])
def test_spans_are_whole_words_inside_the_row_at_the_rate_and_masked_as_a_whole(unit: str) -> None:
    tokens = rows()
    lengths = [1.0] if unit == "word" else geometric_lengths(0.2, 10)
    masked = mask_spans(tokens, TABLE, torch.Generator().manual_seed(1), VOCAB, 0.15, lengths, 0.8, 0.1)
    selected = masked.selected.numpy()
    starts = word_starts_of(tokens, TABLE)
    budget = round(0.15 * tokens.shape[1])
    assert (selected.sum(1) == budget).all()  # the budget met exactly, the last span cut at it
    assert not selected[:, 0].any() and not selected[:, -1].any()  # both boundaries exist
    assert not selected[:, 50].any()  # never a special token
    # a span is its tokens' shared (left, right): the tokens just outside it, as the boundary objective
    # reads them, and each token's offset within it
    width = tokens.shape[1]
    spans: dict[tuple[int, int], list[int]] = {}
    for position, left, right, offset in zip(
        np.flatnonzero(selected.reshape(-1)),
        masked.span_left.tolist(),
        masked.span_right.tolist(),
        masked.span_offset.tolist(),
        strict=True,
    ):
        assert left < position < right and position - left == offset + 1
        assert left // width == right // width == position // width  # within its own row
        spans.setdefault((left, right), []).append(int(position))
    cut, whole_mask, mixed = {}, 0, 0
    flat_starts, flat_inputs = starts.reshape(-1), masked.input_ids.reshape(-1)
    for (left, right), positions in spans.items():
        # contiguous to its end: a later span may run over its first tokens (SpanBERT's spans overlap;
        # a later one starts outside any span, so it covers a prefix) and take them as its own
        assert positions == list(range(positions[0], right))
        assert flat_starts[left + 1]  # a span begins a word
        if right % width and not flat_starts[right]:  # it ends inside a word: the budget's cut
            cut[left // width] = cut.get(left // width, 0) + 1
        pieces = flat_inputs[positions]
        whole_mask += bool((pieces == SPECIAL.mask).all())
        mixed += bool((pieces == SPECIAL.mask).any() and not (pieces == SPECIAL.mask).all())
    assert max(cut.values(), default=0) <= 1  # only the span the budget cut may end inside a word
    assert mixed == 0  # [MASK], random or kept: the whole span alike
    assert 0.7 < whole_mask / len(spans) < 0.9


def test_longer_spans_than_whole_words() -> None:
    tokens = rows()
    runs = {}
    for unit, lengths in (("word", [1.0]), ("span", geometric_lengths(0.2, 10))):
        masked = mask_spans(tokens, TABLE, torch.Generator().manual_seed(2), VOCAB, 0.15, lengths, 0.8, 0.1)
        runs[unit] = len(masked.span_offset) / int((masked.span_offset == 0).sum())  # tokens a span
    assert runs["span"] > 2 * runs["word"]


@pytest.mark.parametrize("changes", [{}, {"embedding_size": 32}])
def test_the_boundary_objective_trains_beside_the_masked_lm_and_its_flops_are_counted(changes: dict) -> None:
    args = objectives_params({"mlm": {"mask_unit": "span", "boundary_loss": True}})
    train = train_config("encoder", "mlm", PretrainParams(seq_len=64, batch_size=8), args, 3)
    model = ModelConfig(
        arch="encoder", vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64
    )
    model = model.with_(**changes)
    batch = make_batch(rows(8, 64), train, batch_generator(3, 0), VOCAB, pieces={"word_starts": TABLE})
    assert {"span_left", "span_right", "span_offset"} <= set(batch)
    module = assert_learns(model, train, batch, steps=8)  # also: the count equals the estimate
    terms = module.terms(batch)
    assert set(terms.extra) == {"boundary"} and 0.0 <= float(terms.accuracies["boundary"]) <= 1.0
    plain = train_config("encoder", "mlm", PretrainParams(seq_len=64, batch_size=8), objectives_params(), 3)
    assert (
        count_step_flops(model, train) > count_step_flops(model, plain) == estimate_step_flops(model, plain)
    )


def test_token_masking_is_unchanged_and_reads_no_word_starts() -> None:
    train = train_config("encoder", "mlm", PretrainParams(seq_len=64, batch_size=8), objectives_params(), 3)
    batch = make_batch(rows(8, 64), train, batch_generator(3, 0), VOCAB)  # no table needed
    assert "span_left" not in batch
    spans = train_config(
        "encoder",
        "mlm",
        PretrainParams(seq_len=64, batch_size=8),
        objectives_params({"mlm": {"mask_unit": "word"}}),
        3,
    )
    with pytest.raises(ValueError, match="objective mlm reads the tokenizer.s word_starts: not given"):
        make_batch(rows(8, 64), spans, batch_generator(3, 0), VOCAB)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"objectives": {"mlm": {"boundary_loss": True}}},
            "objectives.mlm: boundary_loss: the span-boundary objective needs spans",
        ),
        (
            {"objectives": {"mlm": {"mask_unit": "span", "boundary_loss": True, "masking": "static"}}},
            "objectives.mlm: boundary_loss: the span-boundary objective takes masking: dynamic",
        ),
        (
            {"objectives": {"mlm": {"mask_unit": "span"}}, "models": {"decoder_clm": {"objective": "mlm"}}},
            "models.decoder_clm.objective='mlm': does not fit arch 'decoder'",
        ),
        (
            {
                "objectives": {"mlm": {"mask_unit": "span", "boundary_loss": True}},
                "pretrain": {"input_format": "segment_pair"},
                "pack": {"sentences": True},
            },
            "objectives.mlm.boundary_loss: SpanBERT's boundary objective trains single segments",
        ),
    ],
)
def test_bad_span_params_are_one_line_naming_the_key(changes: dict, expected: str) -> None:
    assert_params_error(changes, expected)


def test_the_stage_masks_spans_of_the_tokenizers_words(sample_pipeline: Workdir) -> None:
    """pretrain@<model> reads the tokenizer's word starts: SpanBERT's recipe trains through the stage
    and validation reports the boundary objective's accuracy."""
    settings = {
        "models": {"spanbert": {"arch": "encoder", "objective": "mlm", "preset": "tiny"}},
        "objectives.mlm.mask_unit": "span",
        "objectives.mlm.boundary_loss": True,
        "pretrain.max_steps": 4,
        "pretrain.warmup_steps": 0,
        "pretrain.val_every": 4,
        "pretrain.checkpoint_every": 4,
    }
    with sample_pipeline.changed(settings):
        run_stages(sample_pipeline, "pretrain", "spanbert")
    result = json.loads((sample_pipeline.path / "metrics/pretrain/spanbert.json").read_text())
    assert result["steps"] == 4 and np.isfinite(result["val_loss"])
