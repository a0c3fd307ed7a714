"""The fine-tuning methods (`finetune.method`): what each adds and trains, that a frozen backbone stays
as it was, that the zero-initialised ones start as the backbone, that padding never reaches a real
token, AdaMix's routes, and their params."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmpipe.params.finetune import FinetuneSections
from models.config import ModelConfig
from models.finetune_methods import MixtureAdapter, apply_method, parameter_counts
from models.heads import SequenceHead
from models.transformer import Transformer

CFG = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64)
D, L, HEAD = 32, 2, 32 * 2 + 2  # the width, the layers, a two-class head's weights
OPTIONS = {
    "full": {},
    "frozen": {},
    "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0, "targets": ["attention"]},
    "houlsby": {"bottleneck": 8},
    "pfeiffer": {"bottleneck": 8},
    "adamix": {"bottleneck": 4, "experts": 3, "share_up": False},
    "prefix": {"length": 5, "hidden": 16},
    "prompt": {"length": 6},
}
# what each trains besides the head, on CFG: LoRA's A (r × d) and B (3d × r) on the fused q, k, v of
# each layer; an adapter's down (d → b) and up (b → d) with biases, two a layer (Houlsby) or one
# (Pfeiffer, AdaMix: times its experts); the prefix's table and MLP (d → 16 → 2·L·d); the prompt
ADDED = {
    "frozen": 0,
    "lora": L * (4 * D + 3 * D * 4),
    "houlsby": 2 * L * (2 * D * 8 + 8 + D),
    "pfeiffer": L * (2 * D * 8 + 8 + D),
    "adamix": 3 * L * (2 * D * 4 + 4 + D),
    "prefix": 5 * D + (D * 16 + 16) + (16 * 2 * L * D + 2 * L * D),
    "prompt": 6 * D,
}


def tuned(arch: str, method: str, seed: int = 0) -> SequenceHead:
    torch.manual_seed(seed)
    head = SequenceHead(Transformer(CFG.with_(arch=arch)), 2, frozen=method != "full")
    apply_method(head.backbone, method, OPTIONS[method], seed)
    return head


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(107, 300, (3, 10), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(3, 10, dtype=torch.bool)
    pad[1, 7:] = False
    return ids, pad


@pytest.mark.parametrize("method", list(ADDED))
def test_each_method_trains_its_weights_and_the_head_only(method: str) -> None:
    """The counts are the method's weights and the head's; three steps change those and nothing else
    (the backbone's weights stay bit for bit)."""
    head = tuned("encoder", method)
    backbone = sum(p.numel() for p in Transformer(CFG).parameters())
    assert parameter_counts(head) == (ADDED[method] + HEAD, backbone + ADDED[method] + HEAD)
    before = {name: p.detach().clone() for name, p in head.named_parameters()}
    trained = {name for name, p in head.named_parameters() if p.requires_grad}
    ids, pad = padded_batch()
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    head.train()
    for _ in range(3):
        loss = head.loss(head(ids, pad), torch.tensor([0, 1, 1]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    changed = {name for name, p in head.named_parameters() if not torch.equal(p, before[name])}
    # AdaMix trains the experts its routes drew: three steps draw some of them
    assert changed <= trained if method == "adamix" else changed == trained
    plain = {f"backbone.{name}" for name, _ in Transformer(CFG).named_parameters()}
    assert plain.isdisjoint(name.replace(".base_layer", "") for name in trained)  # LoRA's wrapped layers


@pytest.mark.parametrize("method", ["lora", "houlsby", "pfeiffer", "adamix"])
@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder_decoder"])
def test_the_methods_that_start_at_zero_start_as_the_backbone(arch: str, method: str) -> None:
    """LoRA's B and the adapters' up projections start at zero: the model starts as the pretrained one."""
    torch.manual_seed(0)
    plain = SequenceHead(Transformer(CFG.with_(arch=arch)), 2).eval()
    adapted = tuned(arch, method).eval()
    ids, pad = padded_batch()
    torch.testing.assert_close(adapted(ids, pad), plain(ids, pad), rtol=0, atol=0)


@pytest.mark.parametrize("method", list(ADDED))
@pytest.mark.parametrize("arch", ["encoder", "decoder", "encoder_decoder", "prefix_lm"])
def test_padding_never_reaches_a_real_token(arch: str, method: str) -> None:
    """A padded row's output is the row's alone: the prefix's keys and the prompt's vectors are seen
    by every real token, and the padding by none."""
    head = tuned(arch, method).eval()
    ids, pad = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(head(ids[1:2, :7], pad[1:2, :7]), head(ids, pad)[1:2])


@pytest.mark.parametrize("positions", ["rope", "alibi", "relative", "sinusoidal"])
@pytest.mark.parametrize("method", ["prefix", "prompt"])
def test_prefix_and_prompt_take_every_position_scheme(method: str, positions: str) -> None:
    torch.manual_seed(0)
    head = SequenceHead(Transformer(CFG.with_(arch="decoder", positions=positions)), 2, frozen=True).eval()
    apply_method(head.backbone, method, OPTIONS[method], 0)
    ids, pad = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(head(ids[1:2, :7], pad[1:2, :7]), head(ids, pad)[1:2])


def test_adamix_routes_at_random_in_training_and_averages_its_experts_in_evaluation() -> None:
    torch.manual_seed(0)
    mix = MixtureAdapter(8, 4, experts=3, share_up=False)
    with torch.no_grad():
        for weights in (mix.up, *mix.up_bias, *mix.down_bias):
            weights.normal_()
    y = torch.randn(5, 8)
    mix.eval()
    down, up = mix.down.mean(0), mix.up.mean(0)
    down_bias = torch.stack(list(mix.down_bias)).mean(0)
    up_bias = torch.stack(list(mix.up_bias)).mean(0)
    torch.testing.assert_close(mix(y), y + F.gelu(y @ down.T + down_bias) @ up.T + up_bias)
    mix.train()
    torch.manual_seed(1)
    first = [mix(y) for _ in range(8)]
    torch.manual_seed(1)
    assert all(torch.equal(a, mix(y)) for a in first)  # the routes: torch's generator, seeded
    routes = {(i, j) for i in range(3) for j in range(3)}
    made = {
        (i, j)
        for i in range(3)
        for j in range(3)
        for out in first
        if torch.allclose(
            out, y + F.gelu(y @ mix.down[i].T + mix.down_bias[i]) @ mix.up[j].T + mix.up_bias[j]
        )
    }
    assert made <= routes and len(made) > 1
    assert len(MixtureAdapter(8, 4, experts=3, share_up=True).up) == 1  # AdaMix's default: one up


def sections(method: str, model: dict, **methods: dict) -> FinetuneSections:
    return FinetuneSections.model_validate(
        {
            "models": {"m": {"preset": "tiny", **model}},
            "glue": {"tasks": ["sst2"], "path": "data/sample/glue", "synthetic": True},
            "finetune": {"method": method, "methods": methods, "tasks": {"sst2": {"max_len": 64}}},
        }
    )


BAD_METHODS = [
    (
        ("lora", {"arch": "lstm", "objective": "clm", "positions": "none"}),
        r"finetune.method \(lora\): "
        r"models.m: arch 'lstm' has no transformer blocks to add to \(it fits arch encoder or decoder",
    ),
    (
        ("houlsby", {"arch": "encoder", "objective": "mlm", "share_layers": "all"}),
        r"finetune.method \(houlsby\): models.m: its blocks share weights \(share_layers: all\); use prompt",
    ),
    (
        ("prefix", {"arch": "encoder", "objective": "mlm", "positions": "xl"}),
        r"finetune.method \(prefix\): models.m: Transformer-XL's relative attention takes no prefix",
    ),
    (
        ("prompt", {"arch": "encoder", "objective": "mlm", "max_len": 70}),
        r"finetune.tasks.sst2.max_len \(64\) \+ finetune.methods.prompt.length \(20\) is longer than "
        r"models.m.max_len \(70\)",
    ),
]


@pytest.mark.parametrize(("case", "message"), BAD_METHODS)
def test_a_method_that_does_not_fit_a_model_is_one_line(case: tuple, message: str) -> None:
    method, model = case
    with pytest.raises(ValueError, match=message):
        sections(method, model)


def test_a_methods_lr_replaces_the_tasks_and_says_so() -> None:
    params = sections("lora", {"arch": "encoder", "objective": "mlm"}, lora={"lr": 2e-3, "rank": 2})
    assert params.recipe_of("m", "sst2").lr == 2e-3
    assert params.recipe_key("m", "sst2", "lr") == "finetune.methods.lora.lr"
    assert params.method_params().rank == 2
    assert (
        sections("frozen", {"arch": "lstm", "objective": "clm", "positions": "none"}).method_params().lr
        is None
    )
