"""FLOPs of a training step: the meta-device count equals the 6·N·D + attention estimate for every
architecture and variant, equals the count of a real step on real tensors, and GPU peaks by name."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import ModelConfig
from models.flops import SCHEDULE_FIELDS, _count_step_flops, count_step_flops, estimate_step_flops, peak_flops
from models.pretraining import PretrainModule, make_batch

ARCHS = [("encoder", "mlm"), ("decoder", "clm"), ("encoder_decoder", "span")]
VARIANTS = [
    dict(mlp=m, positions=p, norm=n, norm_position=np_, bias=b)
    for m, p, n, np_, b in [
        ("gelu", "learned", "layernorm", "pre", True),
        ("swiglu", "rope", "rmsnorm", "pre", False),
        ("gelu", "sinusoidal", "layernorm", "post", True),
        ("gelu", "alibi", "layernorm", "pre", True),
        ("gelu", "relative", "rmsnorm", "pre", False),
    ]
]


def configs(arch: str, objective: str, variant: dict, **pretrain):
    extra = {"n_decoder_layers": 3} if arch == "encoder_decoder" else {}
    model = ModelConfig(
        arch=arch, vocab_size=1000, d_model=64, n_layers=2, n_heads=4, d_ff=160, **variant, **extra
    )
    run = PretrainParams(seq_len=32, batch_size=4, **pretrain)
    return model, train_config(arch, objective, run, objectives_params(), seed=3)


@pytest.mark.parametrize(("arch", "objective"), ARCHS)
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_count_equals_the_closed_form_estimate(arch: str, objective: str, variant: dict) -> None:
    model, train = configs(arch, objective, variant)
    counted = count_step_flops(model, train)
    assert counted == estimate_step_flops(model, train)
    # and it scales as it must: twice the batch, twice the FLOPs
    wider = train_config(
        arch, objective, PretrainParams(seq_len=32, batch_size=8), objectives_params(), seed=3
    )
    assert count_step_flops(model, wider) == 2 * counted


@pytest.mark.parametrize(("arch", "objective"), ARCHS)
def test_a_schedule_field_changes_no_count_so_points_share_one(arch: str, objective: str) -> None:
    """count_step_flops keys its cache without SCHEDULE_FIELDS: counted afresh, a train config that
    differs in all of them costs what the cached count says."""
    model, train = configs(arch, objective, VARIANTS[0])
    other = {"seed": 9, "max_steps": 7, "accumulate": 3, "lr": 0.5, "warmup_steps": 2, "schedule": "constant"}
    other |= {"min_lr_ratio": 0.5, "weight_decay": 0.0, "beta1": 0.5, "beta2": 0.5, "sampling": "epoch"}
    other |= {"val_batches": 1, "short_seq_prob": 0.5}
    assert set(other) == SCHEDULE_FIELDS
    assert _count_step_flops(model, dataclasses.replace(train, **other)) == count_step_flops(model, train)


@pytest.mark.parametrize(("arch", "objective"), ARCHS)
@pytest.mark.parametrize(
    "albert",
    [
        {"embedding_size": 16},
        {"share_layers": "all"},
        {"embedding_size": 24, "share_layers": "ffn"},
        {"lm_head": "transform"},  # BERT's prediction head: its dense layer counted
        {"embedding_size": 16, "lm_head": "transform"},
    ],
    ids=lambda v: "-".join(map(str, v.values())),
)
def test_albert_counts_equal_the_estimate_and_sharing_costs_what_unshared_layers_do(
    arch: str, objective: str, albert: dict
) -> None:
    model, train = configs(arch, objective, VARIANTS[0])
    factorized = model.with_(**albert)
    assert count_step_flops(factorized, train) == estimate_step_flops(factorized, train)
    unshared = factorized.with_(share_layers="none")
    assert count_step_flops(factorized, train) == count_step_flops(unshared, train)


@pytest.mark.parametrize(("arch", "objective"), ARCHS[1:])
def test_meta_count_equals_a_real_steps_count(arch: str, objective: str) -> None:
    """CLM and span batches have fixed shapes: the meta count is what a real forward+backward counts
    (with attention as plain matmuls: FlopCounterMode has no formula for the CPU's fused kernel, which
    is why the project counts on the meta device)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model, train = configs(arch, objective, VARIANTS[0])
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(107, 1000, (train.batch_size, train.row_length()), generator=generator)
    module = PretrainModule(model, train)
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        loss, _, _ = module.loss(make_batch(rows, train, generator, 1000))
        loss.backward()
    assert counter.get_total_flops() == count_step_flops(model, train)


def test_peak_flops_by_device_name() -> None:
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("NVIDIA A10") == 125e12  # not A100's
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA L4") == 121e12 and peak_flops("NVIDIA L40S") == 362e12
    assert peak_flops("Tesla T4") is None  # no bf16 tensor cores: MFU is not reported


def test_flops_grow_with_every_size_knob() -> None:
    model, train = configs("decoder", "clm", VARIANTS[0])
    base = count_step_flops(model, train)
    for change in itertools.chain([{"d_model": 128}, {"n_layers": 3}, {"d_ff": 320}, {"vocab_size": 2000}]):
        assert count_step_flops(model.with_(**change), train) > base, change


def test_training_logs_flops_per_second_and_mfu_against_a_peak(tmp_path) -> None:
    """What a GPU run logs (the peak comes from the device's name there; here it is given): the FLOP
    rate of the measured step count, and MFU = rate / peak."""
    import lightning as L
    import numpy as np
    import pandas as pd
    from lightning.pytorch.loggers import CSVLogger

    from models.pretraining import TokenDataModule

    model, train = configs("decoder", "clm", VARIANTS[0])
    np.random.default_rng(0).integers(107, 1000, 20_000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    np.random.default_rng(1).integers(107, 1000, 2_000, dtype=np.uint16).tofile(tmp_path / "val.bin")
    module = PretrainModule(model, replace(train, max_steps=6, warmup_steps=1))
    module.step_flops, module.peak_flops = count_step_flops(model, train), 1e12
    trainer = L.Trainer(
        max_steps=6,
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=TokenDataModule(tmp_path, module.cfg, 1000, "uint16"))
    logged = pd.read_csv(next(tmp_path.rglob("metrics.csv")))
    rate, mfu = logged["train/flops_per_s"].dropna(), logged["train/mfu"].dropna()
    assert len(rate) >= 4 and (rate > 0).all()
    np.testing.assert_allclose(mfu.to_numpy(), rate.to_numpy() / 1e12)
