"""XLNet: the permutation LM's two streams compute what transformers' XLNetLMHeadModel does (on the same
weights, with its perm_mask, target_mapping, memory and bidirectional data), no query sees its own token
or the tokens after it in the order, the pairs predict exactly seq_len // K tokens in XLNet's spans,
reversed rows read their streams backward, a resumed run continues every stream with its memory, the
FLOPs count equals the estimate, the export is XLNetLMHeadModel, and bad params are one line naming
the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.hf import hf_layout
from models.objectives.base import batch_generator
from models.objectives.plm import span_targets
from models.pretraining import PretrainModule, make_batch, stream_segments
from models.special import SPECIAL
from models.transformer import Transformer
from tests.test_pairs import assert_learns
from tests.test_params import assert_params_error
from tests.test_transformer_xl import fit, randomised

XLNET = ModelConfig(
    arch="encoder", vocab_size=300, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64,
    positions="xl", norm_position="post",
)  # fmt: skip
SEQ_LEN = 16
WORD_STARTS = torch.arange(300) % 3 != 1  # two pieces in three start a word


def plm(sampling: str = "random", **args):
    sections = objectives_params({"plm": args})
    run = PretrainParams(seq_len=SEQ_LEN, batch_size=4, sampling=sampling)
    return train_config("encoder", "plm", run, sections, 3)


def batch_of(train, seed: int = 0) -> dict[str, torch.Tensor]:
    rows = torch.randint(SPECIAL.n_special, 300, (4, SEQ_LEN), generator=torch.Generator().manual_seed(seed))
    return make_batch(rows, train, batch_generator(3, seed), 300, pieces={"word_starts": WORD_STARTS})


def module_with_random_weights(model: ModelConfig, train) -> PretrainModule:
    module = PretrainModule(model, train).eval()
    module.model = randomised(model)
    with torch.no_grad():
        module.objective_head.mask_embedding.normal_(std=0.2)
    return module


def test_the_two_streams_compute_what_transformers_xlnet_does() -> None:
    """Three consecutive segments with a memory and bidirectional data (the last half of the rows
    reversed, their distances negated): the query stream's logits at the predicted positions and the
    memories are XLNetLMHeadModel's, given its perm_mask and target_mapping for the same order."""
    transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")
    model_cfg = XLNET.with_(mem_len=16)
    train = plm("stream", k=4, bidirectional_data=True)
    module = module_with_random_weights(model_cfg, train)
    layout = hf_layout(module.model)
    assert layout.architecture == "XLNetLMHeadModel"
    remote = ("auto_map", "custom_pipelines")
    config = {key: value for key, value in layout.config.items() if key not in remote}
    xlnet = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**config, bi_data=True)).eval()
    xlnet.load_state_dict(layout.tensors)
    with torch.no_grad():
        xlnet.transformer.mask_emb.copy_(module.objective_head.mask_embedding.view(1, 1, -1))
    mems, memory = None, None
    for segment in range(3):
        batch = batch_of(train, seed=segment)
        ids, rank = batch["input_ids"], batch["rank"]
        assert batch["reversed"].tolist() == [False, False, True, True]
        at = batch["positions"].view(4, -1) % SEQ_LEN
        # XLNet's perm_mask: 1 where i may not see j (j not before i in the order; the context sees
        # itself), its target_mapping the predicted positions one-hot
        context = (rank == 0)[:, None, :] & (rank == 0)[:, :, None]
        perm_mask = (rank[:, None, :] >= rank[:, :, None]) & ~context
        target_mapping = torch.zeros(4, at.shape[1], SEQ_LEN).scatter_(2, at[:, :, None], 1.0)
        with torch.no_grad():
            theirs = xlnet(
                ids, perm_mask=perm_mask.float(), target_mapping=target_mapping, mems=mems, use_mems=True
            )
            states, memory = module.objective_head.query_states(module.model, batch, memory)
            ours = module.model.lm_logits(states)
        mems = theirs.mems
        torch.testing.assert_close(ours, theirs.logits, atol=2e-5, rtol=0)
        for mine, their in zip(memory, mems, strict=True):
            torch.testing.assert_close(mine, their.transpose(0, 1), atol=2e-5, rtol=0)
    assert ours.abs().max() > 0.5 and memory[0].shape == (4, 16, 64)


def test_no_query_sees_its_own_token_or_those_after_it_in_the_order() -> None:
    """Changing the token at the predicted position of rank r leaves the predictions of ranks 1 to r
    as they were and moves a later one's; a change in the context moves them all."""
    train = plm(k=4, bidirectional_data=False)
    module = module_with_random_weights(XLNET, train)
    batch = batch_of(train)
    at = batch["positions"].view(4, -1) % SEQ_LEN
    ranks = batch["rank"].gather(1, at)

    def predictions(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module.objective_head.query_states(module.model, batch | {"input_ids": ids}, None)[0]

    base = predictions(batch["input_ids"])
    for row in range(4):
        second = int((ranks[row] == 2).nonzero())
        changed = batch["input_ids"].clone()
        changed[row, at[row, second]] = SPECIAL.n_special + (changed[row, at[row, second]] + 7) % 150
        moved = (predictions(changed)[row] - base[row]).abs().amax(-1) > 1e-6
        assert moved.tolist() == (ranks[row] > 2).tolist()
        context = int((batch["rank"][row] == 0).nonzero()[0])
        changed = batch["input_ids"].clone()
        changed[row, context] = SPECIAL.n_special + (changed[row, context] + 7) % 150
        assert ((predictions(changed)[row] - base[row]).abs().amax(-1) > 1e-6).all()


@pytest.mark.parametrize("span", [True, False])
def test_a_pair_predicts_seq_len_over_k_tokens_in_a_random_order(span: bool) -> None:
    train = plm(k=4, span=span)
    batch = batch_of(train)
    rank, at = batch["rank"], batch["positions"].view(4, -1) % SEQ_LEN
    assert at.shape == (4, SEQ_LEN // 4)
    assert torch.equal(batch["labels"].view(4, -1), batch["input_ids"].gather(1, at))  # no [MASK]
    for row in range(4):
        assert sorted(rank[row, at[row]].tolist()) == list(range(1, SEQ_LEN // 4 + 1))
        assert int((rank[row] > 0).sum()) == SEQ_LEN // 4
    assert torch.equal(batch_of(train)["rank"], rank)  # seeded: the same draw
    assert not torch.equal(batch_of(train, seed=1)["rank"], rank)


def test_spans_start_at_a_word_and_fill_with_single_tokens() -> None:
    """XLNet's `_sample_mask`: spans of at most max_span pieces from a word start, each in a context of
    K times its length; the count made up with single tokens, never specials where others remain."""
    starts = torch.tensor([True, False, False] * 40)
    lengths = []
    for seed in range(50):
        chosen = span_targets(starts, 20, 6, 5, torch.Generator().manual_seed(seed))
        assert int(chosen.sum()) <= 20
        edges = torch.diff(torch.cat([torch.zeros(1), chosen.float(), torch.zeros(1)]))
        begins = (edges == 1).nonzero().squeeze(1)
        assert starts[begins].all()
        lengths += ((edges == -1).nonzero().squeeze(1) - begins).tolist()
    assert max(lengths) <= 5 + 5  # two spans may touch
    assert np.mean(lengths) > 1.5  # spans, not single tokens
    rows = torch.full((1, 24), SPECIAL.n_special)
    rows[0, :3] = SPECIAL.eos
    train = plm(k=3)
    train = type(train)(**{**train.__dict__, "batch_size": 1, "seq_len": 24})
    batch = make_batch(rows, train, batch_generator(3, 0), 300, pieces={"word_starts": WORD_STARTS})
    assert (batch["labels"] >= SPECIAL.n_special).all()


def test_reversed_rows_read_their_streams_backward() -> None:
    """Bidirectional data: with 4 rows, the last 2 read their stream from its end, a segment a step
    towards its start, and the pair reverses them, so that each reversed row continues the last."""
    for index in range(20):
        starts, _ = stream_segments(1200, 10, 10, 4, 2, index, backward=2)
        segment = (index // 2) % 30
        lane = index % 2
        assert starts.tolist() == [
            *[(lane * 4 + row) * 150 + 10 * segment for row in (0, 1)],
            *[(lane * 4 + row) * 150 + 140 - 10 * segment for row in (2, 3)],
        ]
    train = plm(bidirectional_data=True)
    rows = torch.arange(SPECIAL.n_special, SPECIAL.n_special + 4 * SEQ_LEN).view(4, SEQ_LEN)
    batch = make_batch(rows, train, batch_generator(3, 0), 300, pieces={"word_starts": WORD_STARTS})
    assert torch.equal(batch["input_ids"][:2], rows[:2])
    assert torch.equal(batch["input_ids"][2:], rows[2:].flip(1))


def test_the_query_stream_trains_the_model_and_its_mask_embedding_stays_out() -> None:
    train = plm(k=4)
    module = assert_learns(XLNET, train, batch_of(train), steps=6)
    assert not any(name.startswith("objective_head") for name in module.model.state_dict())
    assert module.objective_head.mask_embedding.grad is not None


@pytest.mark.parametrize(
    ("changes", "args"),
    [
        ({}, {"bidirectional_data": False, "span": False, "k": 4}),
        ({"mem_len": 16}, {"k": 4}),
        ({"mem_len": 24, "norm_position": "pre", "mlp": "swiglu"}, {"k": 3}),
        ({"lm_head": "transform", "embedding_size": 32}, {"k": 2}),
    ],
)
def test_the_flops_count_equals_the_estimate(changes: dict, args: dict) -> None:
    model = XLNET.with_(**changes)
    train = plm("stream" if model.mem_len else "random", **args)
    counted = count_step_flops(model, train)
    assert counted == estimate_step_flops(model, train)
    fewer = plm("stream" if model.mem_len else "random", **(args | {"k": 8}))
    assert count_step_flops(model, fewer) < counted  # the query stream on fewer predicted positions


def test_a_resumed_xlnet_run_continues_every_stream_with_its_memory(tmp_path: Path) -> None:
    """As Transformer-XL's: resumed from step 3's checkpoint, the weights of the run straight through."""
    np.random.default_rng(0).integers(107, 300, 20_000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.random.default_rng(1).integers(107, 300, 2_000, dtype=np.uint16).tofile(tmp_path / "val.bin")
    model = XLNET.with_(mem_len=16, dropout=0.1)
    pieces = {"word_starts": WORD_STARTS}
    straight = fit(tmp_path, 6, model=model, objective="plm", pieces=pieces)
    saved = torch.load(tmp_path / "ckpt/step3.ckpt", weights_only=True)  # each lane's memory
    assert sorted(saved["memory"]) == [0, 1] and saved["memory"][0][0].shape == (4, 16, 64)
    checkpoint = tmp_path / "ckpt/step3.ckpt"
    resumed = fit(tmp_path, 6, resume=checkpoint, model=model, objective="plm", pieces=pieces)
    for key, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"objectives": {"plm": {"k": 1}}}, "objectives.plm.k=1: Input should be greater than or equal to 2"),
        (
            {"models": {"encoder_mlm": {"objective": "plm"}}},
            "models.encoder_mlm.positions: objective plm needs positions xl, not learned",
        ),
        (
            {"models": {"encoder_mlm": {"objective": "plm", "arch": "prefix_lm", "positions": "xl"}}},
            "models.encoder_mlm.arch: objective plm needs arch encoder, not prefix_lm",
        ),
        (
            {"models": {"decoder_clm": {"objective": "plm"}}},
            "models.decoder_clm.objective='plm': does not fit arch 'decoder'",
        ),
        (
            {"models": {"encoder_mlm": {"objective": "plm", "positions": "xl", "mem_len": 32}}},
            "models.encoder_mlm.mem_len: Transformer-XL's memory continues the previous segment",
        ),
    ],
)
def test_bad_xlnet_params_are_one_line_naming_the_key(changes: dict, expected: str) -> None:
    assert_params_error(changes, expected)


def test_an_xlnet_encoder_fine_tunes_through_its_content_stream() -> None:
    """The model alone is XLNet's content stream: a bidirectional encoder over the input."""
    model = Transformer(XLNET).eval()
    ids = torch.randint(SPECIAL.n_special, 300, (2, 12))
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[1, 8:] = False
    pooled = model.arch.pooled(model, ids, pad, "mean")
    assert pooled.shape == (2, 64) and torch.isfinite(pooled).all()


def test_the_stage_trains_xlnet_and_exports_it_as_transformers_xlnet(sample_pipeline) -> None:
    """pretrain@<model>: XLNet's two streams over a memory on stream batches, half of them read backward,
    spans from the tokenizer's word starts; the final model is the content stream alone, which
    export@<model> writes as XLNetLMHeadModel."""
    import contextlib
    import json

    from models.transformer import load_pretrained
    from tests.pipeline_helpers import run_stages, stage_main

    settings = {
        "models": {
            "xlnet": {
                "arch": "encoder",
                "objective": "plm",
                "preset": "tiny",
                "positions": "xl",
                "norm_position": "post",
                "mem_len": 32,
            },  # fmt: skip
        },
        "pretrain.seq_len": 32,
        "pretrain.sampling": "stream",
        "pretrain.max_steps": 4,
        "pretrain.warmup_steps": 0,
        "pretrain.val_every": 4,
        "pretrain.checkpoint_every": 4,
    }
    with sample_pipeline.changed(settings), contextlib.chdir(sample_pipeline.path):
        run_stages(sample_pipeline, "pretrain", "xlnet")
        stage_main("export")(["xlnet"])
    path = sample_pipeline.path
    metrics = json.loads((path / "metrics/pretrain/xlnet.json").read_text())
    assert metrics["steps"] == 4 and np.isfinite(metrics["val_loss"])
    model, config = load_pretrained(path / "checkpoints/xlnet/final")
    assert config["objective"] == "plm"
    assert model.state_dict().keys() == Transformer(model.cfg).state_dict().keys()  # no query stream
    exported = json.loads((path / "checkpoints/xlnet/hf/config.json").read_text())
    assert exported["architectures"] == ["XLNetLMHeadModel"] and exported["attn_type"] == "bi"
