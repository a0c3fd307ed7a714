"""Architectures: what each position may see, closed-form parameter counts, tied embeddings, presets."""

from __future__ import annotations

import itertools

import pytest
import torch

from models.config import PRESETS, ModelConfig
from models.transformer import Transformer

SMALL = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16)


def model_of(**changes) -> Transformer:
    torch.manual_seed(0)
    return Transformer(SMALL.with_(**changes)).eval()


def ids(seed: int, batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(10, 300, (batch, length), generator=torch.Generator().manual_seed(seed))


def changed_positions(before: torch.Tensor, after: torch.Tensor) -> list[int]:
    return [t for t in range(before.shape[1]) if not torch.allclose(before[:, t], after[:, t], atol=1e-6)]


VARIANTS = [
    dict(positions=p, norm_position=n, mlp=m)
    for p, n, m in itertools.product(
        ["learned", "sinusoidal", "rope", "alibi", "relative"], ["pre", "post"], ["gelu", "swiglu"]
    )
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_decoder_is_causal_and_encoder_bidirectional(variant) -> None:
    x = ids(1)
    x2 = x.clone()
    x2[:, 6] = 7
    decoder = model_of(arch="decoder", **variant)
    assert changed_positions(decoder(x), decoder(x2)) == list(range(6, 12))
    encoder = model_of(arch="encoder", **variant)
    assert changed_positions(encoder(x), encoder(x2)) == list(range(12))


@pytest.mark.parametrize("variant", VARIANTS[:4] + VARIANTS[-4:], ids=lambda v: "-".join(v.values()))
def test_encoder_decoder_decoder_is_causal_and_sees_every_encoder_position(variant) -> None:
    model = model_of(arch="encoder_decoder", **variant)
    src, tgt = ids(2, length=10), ids(3, length=8)
    base = model(src, decoder_ids=tgt)
    tgt2 = tgt.clone()
    tgt2[:, 4] = 9
    assert changed_positions(base, model(src, decoder_ids=tgt2)) == list(range(4, 8))
    for i in range(10):
        src2 = src.clone()
        src2[:, i] = 9
        assert changed_positions(base, model(src2, decoder_ids=tgt)) == list(range(8))


def test_padding_is_invisible_to_real_tokens() -> None:
    for arch in ("encoder", "decoder"):
        model = model_of(arch=arch)
        x = ids(4, length=10)
        pad = torch.ones_like(x, dtype=torch.bool)
        pad[:, 7:] = False
        x2 = x.clone()
        x2[:, 7:] = 0
        assert changed_positions(model(x, pad)[:, :7], model(x2, pad)[:, :7]) == []


def closed_form_parameters(cfg: ModelConfig) -> int:
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    b = 1 if cfg.bias else 0
    norm = (2 * d if cfg.bias else d) if cfg.norm == "layernorm" else d
    attention = 4 * d * d + 4 * d * b
    mlp = (2 if cfg.mlp == "swiglu" else 1) * (d * f + f * b) + f * d + d * b
    e = cfg.embedding_size or d
    total = v * e + (cfg.max_len * e if cfg.positions == "learned" else 0)
    total += e * d + d * b if cfg.embedding_size else 0  # ALBERT's projection
    relative = 32 * cfg.n_heads if cfg.positions == "relative" else 0  # T5's table: 32 buckets, each stack

    def stack(layers: int, cross: int) -> int:
        """Each group's shared part once, each layer's own part per layer."""
        cross_norm = norm if cross else 0
        full = attention + cross + mlp + 2 * norm + cross_norm
        shared = {
            "none": 0,
            "all": full,
            "attention": attention + norm + cross + cross_norm,
            "ffn": mlp + norm,
        }[cfg.share_layers]
        own = 0 if cfg.share_layers == "all" else full - shared
        groups = cfg.layer_groups if cfg.share_layers != "none" else 0
        return groups * shared + layers * own + norm + relative

    if cfg.arch in ("encoder", "encoder_decoder", "decoder"):
        total += stack(cfg.n_layers, 0)
    if cfg.arch == "encoder_decoder":
        total += stack(cfg.decoder_layers, attention)
    return total


@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder_decoder"])
@pytest.mark.parametrize(
    "variant",
    [
        {},
        dict(mlp="swiglu", norm="rmsnorm", bias=False, positions="rope"),
        dict(positions="sinusoidal"),
        dict(positions="alibi"),
        dict(positions="relative", norm="rmsnorm"),
        dict(norm_position="post", bias=False),
        dict(embedding_size=16),  # ALBERT's
        dict(share_layers="all"),
        dict(share_layers="attention", n_layers=4, layer_groups=2, embedding_size=8, bias=False),
        dict(share_layers="ffn", n_layers=3, layer_groups=2),
    ],
)
def test_parameter_count_matches_closed_form(arch, variant) -> None:
    extra = {"n_decoder_layers": 3} if arch == "encoder_decoder" else {}
    cfg = SMALL.with_(arch=arch, **variant, **extra)
    assert Transformer(cfg).num_parameters() == closed_form_parameters(cfg)


def test_tied_embeddings_are_one_tensor() -> None:
    model = model_of(arch="decoder")
    vocab_shaped = [n for n, p in model.named_parameters() if p.shape == (300, 32)]
    assert vocab_shaped == ["embed.weight"]
    hidden = model(ids(5))
    model.lm_logits(hidden[:, -1]).sum().backward()
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0


def test_presets_have_the_papers_shapes() -> None:
    bert = ModelConfig(arch="encoder", vocab_size=30522, **PRESETS["bert-base"])
    # BERT-base's 110M also counts segment embeddings, the pooler and the MLM head transform
    assert Transformer(bert).num_parameters() == pytest.approx(108.9e6, rel=0.005)
    gpt = ModelConfig(arch="decoder", vocab_size=40478, **PRESETS["gpt1"])
    assert Transformer(gpt).num_parameters() == pytest.approx(116.5e6, rel=0.01)
    # ALBERT's Tables 3 and 4 at base size: E 128 not shared 89 M, all shared at E 768 31 M, ALBERT-base
    # (both) 12 M, which also counts the segment embeddings, the pooler and the MLM head transform
    counts = [
        Transformer(bert.with_(**albert)).num_parameters() / 1e6
        for albert in (
            {"embedding_size": 128},
            {"share_layers": "all"},
            {"embedding_size": 128, "share_layers": "all"},
        )
    ]
    assert counts == pytest.approx([89.1, 30.9, 11.2], abs=0.05)


def test_config_rejects_conflicts() -> None:
    with pytest.raises(ValueError, match="divisible by n_heads"):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="encoder-decoder only"):
        ModelConfig(arch="decoder", n_decoder_layers=2)
    with pytest.raises(ValueError, match="exceeds max_len=16"):
        model_of(arch="decoder")(ids(1, length=17))


def test_alibi_and_relative_positions_are_the_papers_own() -> None:
    """ALiBi's slopes as BLOOM computes them (any head count); T5's buckets as transformers' T5 does;
    the bias itself: ALiBi's −slope·distance, T5's table entry of each (query, key)'s bucket."""
    transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.t5.modeling_t5 import T5Attention

    from models.transformer import PositionBias, alibi_slopes, relative_buckets

    assert transformers is not None
    for heads in (1, 2, 4, 6, 8, 12, 16):
        bloom = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)
        torch.testing.assert_close(alibi_slopes(heads), bloom[:, 0, 1])  # slope × position 1
    relative = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        t5 = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets=32, max_distance=128)
        assert torch.equal(relative_buckets(relative, bidirectional, 32, 128), t5)
    alibi = PositionBias(SMALL.with_(positions="alibi"))(5, False, torch.device("cpu"))
    # 4 heads: the first head's slope is 2^-2; the penalty is symmetric in a bidirectional stack
    assert alibi.shape == (1, 4, 5, 5) and alibi[0, 0, 3, 0] == -0.25 * 3 == alibi[0, 0, 0, 3]
    table = PositionBias(SMALL.with_(positions="relative"))
    causal = table(5, True, torch.device("cpu"))
    bucket = T5Attention._relative_position_bucket(torch.tensor(-3), False)  # key 3 before the query
    assert torch.equal(causal[0, :, 4, 1], table.table.weight[bucket])


@pytest.mark.parametrize(
    ("arch", "objective", "positions"),
    [
        ("encoder", "mlm", "alibi"),
        ("decoder", "clm", "relative"),
        ("prefix_lm", "lm", "alibi"),
        ("encoder_decoder", "span", "relative"),
    ],
)
def test_attention_bias_positions_train_and_their_flops_are_counted(arch, objective, positions) -> None:
    from lmpipe.params.pretrain import PretrainParams, objectives_params
    from lmpipe.pretraining import train_config
    from models.objectives.base import batch_generator
    from models.pretraining import make_batch
    from tests.test_pairs import assert_learns, rows

    train = train_config(arch, objective, PretrainParams(seq_len=24, batch_size=4), objectives_params(), 2)
    model = SMALL.with_(arch=arch, positions=positions, max_len=64, vocab_size=400)
    assert_learns(model, train, make_batch(rows(4, train.row_length()), train, batch_generator(2, 0), 400))
