"""Today's three (architecture, objective) pairs give the batches and the training trajectory they gave
before objectives and architectures became independent: a few steps of each, pinned to the values
the earlier code computed (batches exactly; losses and a weight checksum to float tolerance, since
the kernels' float bits differ between CPUs)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from lmpipe import pretraining
from lmpipe.params.pretrain import PretrainParams, objectives_params
from models.config import ModelConfig
from models.pretraining import PackedBatches, PretrainModule, TrainConfig
from models.transformer import weight_decay_groups

VOCAB = 300
PAIRS = {"encoder": "mlm", "decoder": "clm", "encoder_decoder": "span"}
KEYS = {"encoder": ("input_ids", "positions", "labels"), "decoder": ("input_ids", "labels")}
# sha256 of the first 3 micro-batches' tensors; the 4 step losses; the sum of |weights| after them
PINNED = {
    "encoder": (
        "01d57a8a04a5c2e092c28befc0fae9918db9fb11309c256362aa648d7983a2cb",
        [5.642662525177002, 5.636870384216309, 5.729936599731445, 5.675704479217529],
        609.4864387067868,
    ),
    "decoder": (
        "c956e1ba05f11174506930ec1477f1fc159c1c1fdb04715bea4298f225830c72",
        [5.699997425079346, 5.710859775543213, 5.700645923614502, 5.700706958770752],
        610.4376314143598,
    ),
    "encoder_decoder": (
        "833f9ed1037059b3e868c7415458a7226ae17cdf6293e299e40bd5483fd93e20",
        [5.709286212921143, 5.595829010009766, 5.560151100158691, 5.487328052520752],
        1235.5869289687982,
    ),
}


def train_config(arch: str) -> TrainConfig:
    """Four steps of 4 rows of 32 at a constant 1e-3, the objectives' default params, seed 7."""
    run = PretrainParams(
        seq_len=32, batch_size=4, max_steps=4, warmup_steps=0, schedule="constant", val_batches=1
    )
    return pretraining.train_config(arch, PAIRS[arch], run, objectives_params(), 7)


def batches_digest(batches: list[dict[str, torch.Tensor]], keys: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for batch in batches:
        for key in keys:
            digest.update(key.encode() + batch[key].numpy().tobytes())
    return digest.hexdigest()


def trajectory(arch: str, tmp_path) -> tuple[str, list[float], float]:
    tokens = np.random.default_rng(3).integers(107, VOCAB, 4000).astype(np.uint16)
    tokens[::37] = 3  # EOS between documents
    tokens.tofile(tmp_path / "train.bin")
    cfg = train_config(arch)
    data = PackedBatches(tmp_path / "train.bin", "uint16", cfg, VOCAB, 0, cfg.max_steps)
    batches = [data.batch(step) for step in range(cfg.max_steps)]
    torch.manual_seed(0)
    model = ModelConfig(arch=arch, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=64)
    module = PretrainModule(model, cfg)
    optimizer = torch.optim.AdamW(weight_decay_groups(module.model, cfg.weight_decay), lr=cfg.lr)
    losses = []
    for batch in batches:
        loss, _, _ = module.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    checksum = sum(p.detach().abs().double().sum().item() for p in module.model.parameters())
    return batches_digest(batches[:3], KEYS.get(arch, KEYS["decoder"])), losses, checksum


@pytest.mark.parametrize("arch", list(PAIRS))
def test_pair_is_unchanged(arch: str, tmp_path) -> None:
    digest, losses, checksum = trajectory(arch, tmp_path)
    pinned_digest, pinned_losses, pinned_checksum = PINNED[arch]
    assert digest == pinned_digest
    assert losses == pytest.approx(pinned_losses, rel=1e-5)
    assert checksum == pytest.approx(pinned_checksum, rel=1e-6)
