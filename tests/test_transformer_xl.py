"""Transformer-XL: its relative attention and memory compute what transformers' XLNet does (causally, on
the same weights), a segment over its memory has the states of the whole stream, each row slot reads
its stream's next segment every step, a resumed run continues the streams with the memory it was killed
with, the FLOPs count holds the memory, and bad params are one line naming the key."""

from __future__ import annotations

import itertools
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.pretraining import PackedBatches, PretrainModule, TokenDataModule, stream_segments
from models.transformer import Transformer
from tests.test_params import assert_params_error

XL = ModelConfig(
    arch="decoder", vocab_size=300, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64, positions="xl"
)


def xlnet_of(model: Transformer):
    """transformers' XLNet, causal (attn_type uni), with our model's weights: its relative attention is
    Transformer-XL's, with per-layer u and v (untie_r) and post-LN blocks."""
    transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")
    cfg = model.cfg
    d, heads, head = cfg.d_model, cfg.n_heads, cfg.head_dim
    xlnet = transformers.XLNetModel(
        transformers.XLNetConfig(
            vocab_size=cfg.vocab_size,
            d_model=d,
            n_layer=cfg.n_layers,
            n_head=heads,
            d_inner=cfg.d_ff,
            ff_activation="gelu",
            untie_r=True,
            attn_type="uni",
            mem_len=cfg.mem_len,
            dropout=0.0,
            layer_norm_eps=cfg.norm_eps,
        )
    ).eval()
    with torch.no_grad():
        xlnet.word_embedding.weight.copy_(model.embed.weight)
        for ours, theirs in zip(model.decoder.blocks, xlnet.layer, strict=True):
            attention, relative = ours.self_attn, theirs.rel_attn
            relative.q.copy_(attention.q.weight.T.reshape(d, heads, head))
            relative.k.copy_(attention.kv.weight[:d].T.reshape(d, heads, head))
            relative.v.copy_(attention.kv.weight[d:].T.reshape(d, heads, head))
            relative.o.copy_(attention.out.weight.reshape(d, heads, head))
            relative.r.copy_(attention.r.weight.T.reshape(d, heads, head))
            relative.r_w_bias.copy_(attention.content_bias)
            relative.r_r_bias.copy_(attention.position_bias)
            relative.layer_norm.load_state_dict(ours.norm1.state_dict())
            theirs.ff.layer_norm.load_state_dict(ours.norm2.state_dict())
            theirs.ff.layer_1.load_state_dict(ours.mlp.up.state_dict())
            theirs.ff.layer_2.load_state_dict(ours.mlp.down.state_dict())
    return xlnet


def randomised(cfg: ModelConfig) -> Transformer:
    """A model whose every weight is far from its init (u and v start at zero)."""
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(std=0.2)
    return model


def test_relative_attention_and_memory_compute_what_transformers_xlnet_does() -> None:
    """Three consecutive segments, the memory carried: the same states and the same memories."""
    model = randomised(XL.with_(norm_position="post", mem_len=16))
    xlnet = xlnet_of(model)
    ids = torch.randint(0, 300, (2, 3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        alone = xlnet(ids[:, 0]).last_hidden_state
        torch.testing.assert_close(model.decode(ids[:, 0]), alone, atol=2e-5, rtol=0)
        mems, memory = None, None
        for segment in range(3):
            theirs = xlnet(ids[:, segment], mems=mems, use_mems=True)
            mems = theirs.mems
            ours, memory = model.recur(ids[:, segment], memory)
            torch.testing.assert_close(ours, theirs.last_hidden_state, atol=2e-5, rtol=0)
            for mine, their in zip(memory, mems, strict=True):
                torch.testing.assert_close(mine, their.transpose(0, 1), atol=2e-5, rtol=0)
        assert memory[0].shape == (2, 16, 64)  # the last mem_len states of the stream


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_a_segment_over_its_memory_has_the_states_of_the_whole_stream(norm_position: str) -> None:
    """With a memory as long as the segments, the second segment's states are those of both segments
    read as one causal sequence: relative positions make the memory's states reusable as they are. The
    memory is cut from the graph: no gradient reaches the first segment through it."""
    model = randomised(XL.with_(norm_position=norm_position, mem_len=12))
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = model.decode(ids)
    _, memory = model.recur(ids[:, :12], None)
    assert not any(states.requires_grad for states in memory)
    second, _ = model.recur(ids[:, 12:], memory)
    torch.testing.assert_close(second.detach(), whole[:, 12:], atol=2e-5, rtol=0)
    alone, _ = model.recur(ids[:, 12:], None)
    assert not torch.allclose(alone, whole[:, 12:], atol=1e-3)  # the memory is what carries the context


def test_each_row_slot_reads_its_streams_next_segment_every_step() -> None:
    """4 lanes (2 micro-batches × 2 processes) of 3 rows: 12 streams of 100 tokens, 9-token rows
    stepping 8 on. A lane's position p reads each stream's segment p, back at its start after the last
    whole one (11 a stream), where its memory is not carried."""
    for index in range(60):
        starts, (lane, continues) = stream_segments(1200, 9, 8, 3, 4, index)
        segment = (index // 4) % 12
        assert lane == index % 4 and continues == (segment != 0)
        assert starts.tolist() == [(lane * 3 + row) * 100 + 8 * segment for row in range(3)]
    with pytest.raises(ValueError, match="12 streams of 5, each shorter than a row"):
        stream_segments(60, 9, 8, 3, 4, 0)


def test_stream_batches_are_the_same_on_any_number_of_processes(tmp_path: Path) -> None:
    """Two processes accumulating nothing read what one process accumulating two micro-batches does:
    the same lanes, so the same memories; built by two DataLoader workers from an odd step, the same."""
    from dataclasses import replace

    tokens = np.arange(107, 107 + 4000, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    run = PretrainParams(seq_len=8, batch_size=4, sampling="stream")
    cfg = train_config("decoder", "clm", run, objectives_params(), seed=5)
    path = tmp_path / "train.bin"
    one = list(PackedBatches(path, "uint16", replace(cfg, accumulate=2), 2000, 0, 24))
    ranks = [list(PackedBatches(path, "uint16", cfg, 2000, 0, 12, rank, world_size=2)) for rank in (0, 1)]
    for step, rank in itertools.product(range(12), (0, 1)):
        assert torch.equal(ranks[rank][step]["input_ids"], one[2 * step + rank]["input_ids"])
        assert ranks[rank][step]["stream"] == one[2 * step + rank]["stream"] == (rank, step != 0)
    # a lane's next micro-batch continues each of its rows where the last ended
    assert torch.equal(one[2]["input_ids"][:, 0], one[0]["labels"][:, -1])
    resumed = PackedBatches(path, "uint16", replace(cfg, accumulate=2), 2000, 7, 24)
    for a, b in zip(one[7:], DataLoader(resumed, batch_size=None, num_workers=2), strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and a["stream"] == tuple(b["stream"])


def fit(
    data: Path,
    steps: int,
    resume: Path | None = None,
    model: ModelConfig | None = None,
    objective: str = "clm",
    pieces: dict[str, torch.Tensor] | None = None,
) -> PretrainModule:
    """Transformer-XL pretraining (or XLNet's, objective plm) with Lightning on the tokens in `data`:
    two lanes (micro-batches a step), dropout on, a step checkpoint every 3 steps in data/ckpt."""
    from dataclasses import replace

    from lightning.pytorch.callbacks import ModelCheckpoint

    run = PretrainParams(seq_len=16, batch_size=4, accumulate=2, sampling="stream", warmup_steps=1)
    arch = "decoder" if model is None else model.arch
    cfg = replace(train_config(arch, objective, run, objectives_params(), seed=3), max_steps=steps)
    torch.manual_seed(0)
    module = PretrainModule(model or XL.with_(mem_len=24, dropout=0.1), cfg)
    checkpoints = ModelCheckpoint(
        dirpath=data / "ckpt", filename="step{step}", auto_insert_metric_name=False,
        every_n_train_steps=3, save_top_k=-1,
    )  # fmt: skip
    trainer = L.Trainer(
        max_steps=steps,
        accumulate_grad_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=data,
        callbacks=[checkpoints],
    )
    datamodule = TokenDataModule(data, cfg, 300, "uint16", pieces=pieces)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    return module


def test_a_resumed_run_continues_every_stream_with_the_memory_it_stopped_with(tmp_path: Path) -> None:
    """Resumed from step 3's checkpoint, the same weights at step 6 as straight through; the checkpoint
    holds each lane's memory, and without it the resumed run is another run."""
    np.random.default_rng(0).integers(107, 300, 20_000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.random.default_rng(1).integers(107, 300, 2_000, dtype=np.uint16).tofile(tmp_path / "val.bin")
    straight = fit(tmp_path, 6)
    checkpoint = tmp_path / "ckpt/step3.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    assert sorted(saved["memory"]) == [0, 1] and saved["memory"][0][0].shape == (4, 24, 64)
    resumed = fit(tmp_path, 6, resume=checkpoint)
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    del saved["memory"]
    forgetful = tmp_path / "forgetful.ckpt"
    torch.save(saved, forgetful)
    other = fit(tmp_path, 6, resume=forgetful)
    assert not torch.equal(other.model.embed.weight, straight.model.embed.weight)


@pytest.mark.parametrize(
    ("arch", "objective", "changes"),
    [
        ("decoder", "clm", {}),
        ("decoder", "clm", {"mem_len": 48}),
        ("decoder", "clm", {"mem_len": 16, "norm_position": "post", "embedding_size": 32}),
        ("encoder", "mlm", {}),
        ("encoder", "mlm", {"mem_len": 16, "norm_position": "post"}),  # XLNet's "DAE + Transformer-XL"
        ("encoder_decoder", "span", {}),
        ("prefix_lm", "lm", {}),
    ],
)
def test_the_flops_count_holds_the_memory_and_equals_the_estimate(
    arch: str, objective: str, changes: dict
) -> None:
    model = XL.with_(arch=arch, vocab_size=1000, **changes)
    sampling = "stream" if changes.get("mem_len") else "random"
    run = PretrainParams(seq_len=32, batch_size=4, sampling=sampling)
    train = train_config(arch, objective, run, objectives_params(), 3)
    counted = count_step_flops(model, train)
    assert counted == estimate_step_flops(model, train)
    if changes.get("mem_len"):  # attending to the memory costs: more than the same model without it
        assert counted > count_step_flops(model.with_(mem_len=0), train)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"models": {"decoder_clm": {"mem_len": 32}}},
            "models.decoder_clm.mem_len: Transformer-XL's memory needs its relative positions, positions: xl",
        ),
        (
            {"models": {"encoder_mlm": {"arch": "prefix_lm", "mem_len": 32, "positions": "xl"}}},
            "models.encoder_mlm.mem_len: Transformer-XL's memory is a decoder's or (XLNet's) an "
            "encoder's, not arch prefix_lm's",
        ),
        (
            {"models": {"decoder_clm": {"mem_len": 32, "positions": "xl"}}},
            "models.decoder_clm.mem_len: Transformer-XL's memory continues the previous segment of the same "
            "stream, which needs pretrain.sampling: stream, not random",
        ),
        (
            {
                "models": {"decoder_clm": {"mem_len": 32, "positions": "xl", "objective": "mtp"}},
                "pretrain": {"sampling": "stream"},
            },
            "models.decoder_clm.mem_len: objective mtp's head runs the model without its memory",
        ),
        ({"pretrain": {"sampling": "ordered"}}, "pretrain.sampling='ordered'"),
    ],
)
def test_bad_transformer_xl_params_are_one_line_naming_the_key(changes: dict, expected: str) -> None:
    assert_params_error(changes, expected)


def test_the_loss_by_context_scores_the_same_tokens_at_every_length() -> None:
    """At its training length, a Transformer-XL model's loss is that of plain segments, by block of
    tokens; longer, its memory changes it; a vanilla model is measured up to its max_len only."""
    import torch.nn.functional as F

    from models.context import loss_by_context

    model = randomised(XL.with_(max_len=32))
    tokens = np.random.default_rng(3).integers(0, 300, 4 * 129).astype(np.uint16)
    losses = loss_by_context(model, tokens, 16, [8, 16, 48], rows=4, span=129, block=32)
    streams = torch.from_numpy(tokens.astype(np.int64)).view(4, 129)
    with torch.no_grad():
        logits = model.lm_logits(
            torch.cat([model.decode(streams[:, s : s + 16]) for s in range(0, 128, 16)], 1)
        )
    per_token = F.cross_entropy(logits.transpose(1, 2), streams[:, 1:], reduction="none")
    np.testing.assert_allclose(losses[16], per_token.view(4, 4, 32).mean(-1).numpy(), rtol=1e-5)
    assert sorted(losses) == [8, 16, 48] and len({float(loss.mean()) for loss in losses.values()}) == 3
    vanilla = randomised(XL.with_(positions="learned", max_len=32))
    assert sorted(loss_by_context(vanilla, tokens, 16, [8, 16, 48], rows=4, span=129, block=32)) == [8, 16]
    with pytest.raises(ValueError, match="not whole blocks of 32"):
        loss_by_context(model, tokens, 16, [16], rows=4, span=100, block=32)


def test_the_stage_trains_transformer_xl_and_measures_it_by_context(sample_pipeline) -> None:
    """pretrain@<model> with a memory on stream batches: validation reads consecutive segments, and the
    final model's loss at each context length is in its metrics (a vanilla decoder's up to max_len)."""
    import json

    import pandas as pd

    from tests.pipeline_helpers import run_stages

    settings = {
        "models": {
            "xl": {"arch": "decoder", "objective": "clm", "preset": "tiny", "positions": "xl", "mem_len": 32},
            "vanilla": {"arch": "decoder", "objective": "clm", "preset": "tiny"},  # max_len 128
        },
        "pretrain.seq_len": 32,
        "pretrain.sampling": "stream",
        "pretrain.context_lengths": [16, 64, 256],
        "pretrain.max_steps": 4,
        "pretrain.warmup_steps": 0,
        "pretrain.val_every": 4,
        "pretrain.checkpoint_every": 4,
    }
    with sample_pipeline.changed(settings):
        run_stages(sample_pipeline, "pretrain", "xl", "pretrain", "vanilla")
    metrics = {
        name: json.loads((sample_pipeline.path / f"metrics/pretrain/{name}.json").read_text())
        for name in ("xl", "vanilla")
    }
    assert sorted(metrics["xl"]["val_loss_by_context"], key=int) == ["16", "64", "256"]
    assert sorted(metrics["vanilla"]["val_loss_by_context"], key=int) == ["16", "64"]
    blocks = pd.read_csv(sample_pipeline.path / "plots/pretrain_context/xl.csv")
    assert sorted(blocks["length"].unique()) == [16, 64, 256] and len(blocks) % 3 == 0
    assert np.isclose(
        blocks[blocks["length"] == 16]["loss"].mean(), metrics["xl"]["val_loss_by_context"]["16"]
    )
    assert all(np.isfinite(m["val_loss"]) and m["steps"] == 4 for m in metrics.values())


def test_a_context_comparison_pairs_the_same_blocks_and_says_which_is_better() -> None:
    """Lower loss on every block is `better`, the same losses `within noise` at Δ 0; a length the
    baseline did not reach has no verdict; the report's table and plot are made of it."""
    from flows.ablation import plot_context
    from lmpipe.report import context

    rng = np.random.default_rng(0)
    blocks = rng.normal(4.0, 0.3, (8, 6))

    def frame(by_length: dict[int, np.ndarray]):
        import pandas as pd

        rows = [(n, s, b, loss) for n, losses in by_length.items() for (s, b), loss in np.ndenumerate(losses)]
        return pd.DataFrame(rows, columns=["length", "stream", "block", "loss"])

    contexts = {
        ("vanilla", "decoder_clm"): frame({64: blocks, 128: blocks}),
        ("xl", "decoder_xl"): frame({64: blocks - 0.05, 128: blocks - 0.1, 256: blocks - 0.2}),
        ("same", "decoder_xl"): frame({64: blocks}),
    }
    table = context.comparison(contexts, ("vanilla", "decoder_clm"), seed=0)
    row = table.set_index(["experiment", "length"])
    assert row.loc[("xl", 128), "verdict"] == "better" and row.loc[("xl", 128), "delta"] == pytest.approx(
        -0.1
    )
    assert row.loc[("same", 64), "verdict"] == "within noise" and row.loc[("same", 64), "delta"] == 0
    assert row.loc[("xl", 256), "verdict"] == "baseline not measured at this length"
    assert row.loc[("vanilla", 64), "perplexity"] == pytest.approx(np.exp(blocks.mean()))
    assert "| xl | decoder_xl |" in context.markdown(table, "point `vanilla`")
    assert plot_context(table).startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="not the same tokens"):
        context.loss_difference(blocks.ravel(), blocks.ravel()[:10], 0)
