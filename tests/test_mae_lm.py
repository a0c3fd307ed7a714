"""MAE-LM: the encoder never sees the masked tokens, the decoder predicts them, only the encoder is the
model; the FLOPs count includes the decoder; the preset's rows; bad params are one line."""

from __future__ import annotations

import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.objectives.base import batch_generator
from models.pretraining import PretrainModule, make_batch
from models.special import SPECIAL
from tests.test_pairs import assert_learns
from tests.test_params import assert_params_error

MODEL = ModelConfig(arch="encoder", vocab_size=1000, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64)


def mae_lm(layers: int = 2):
    args = objectives_params({"mae_lm": {"decoder_layers": layers}})
    return train_config("encoder", "mae_lm", PretrainParams(seq_len=32, batch_size=8), args, 3)


def batch_of(train) -> dict[str, torch.Tensor]:
    rows = torch.randint(SPECIAL.n_special, 1000, (8, 32), generator=torch.Generator().manual_seed(0))
    return make_batch(rows, train, batch_generator(3, 0), 1000)


@pytest.mark.parametrize("positions", ["learned", "rope", "relative"])
def test_the_encoder_never_sees_the_masked_tokens(positions: str) -> None:
    """Whatever stands at the masked places, the step's loss is the same: the encoder holds them out
    and the decoder reads [MASK] there."""
    train = mae_lm()
    batch = batch_of(train)
    torch.manual_seed(0)
    module = PretrainModule(MODEL.with_(positions=positions), train).eval()
    other = dict(batch)
    flat = batch["input_ids"].reshape(-1).clone()
    flat[batch["positions"]] = torch.randint(SPECIAL.n_special, 1000, batch["positions"].shape)
    other["input_ids"] = flat.view_as(batch["input_ids"])
    with torch.no_grad():
        assert module.terms(batch).loss == module.terms(other).loss
        visible = batch["input_ids"].clone()
        visible.reshape(-1)[(batch["positions"][0] + 1) % visible.numel()] = 7  # a token it reads
        assert module.terms(dict(batch, input_ids=visible)).loss != module.terms(batch).loss


def test_the_decoder_trains_the_encoder_and_is_not_the_model() -> None:
    train = mae_lm()
    module = assert_learns(MODEL, train, batch_of(train), steps=8)
    assert module.objective_head is not None and len(module.objective_head.stack.blocks) == 2
    assert not any(name.startswith("objective_head") for name in module.model.state_dict())


@pytest.mark.parametrize("layers", [2, 4, 6])
@pytest.mark.parametrize("changes", [{}, {"embedding_size": 32, "positions": "rope"}])
def test_the_flops_count_includes_the_decoder_and_equals_the_estimate(layers: int, changes: dict) -> None:
    model, train = MODEL.with_(**changes), mae_lm(layers)
    counted = count_step_flops(model, train)
    assert counted == estimate_step_flops(model, train)
    if layers > 2:
        assert counted > count_step_flops(model, mae_lm(layers - 2))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"objectives": {"mae_lm": {"decoder_layers": 0}}},
            "objectives.mae_lm.decoder_layers=0: Input should be greater than or equal to 1",
        ),
        (
            {"models": {"decoder_clm": {"objective": "mae_lm"}}},
            "models.decoder_clm.objective='mae_lm': does not fit arch 'decoder'",
        ),
        (
            {"objectives": {"unilm": {"components": {"bidirectional": {"objective": "mae_lm"}}}}},
            "components.bidirectional: mae_lm trains a head of its own",
        ),
    ],
)
def test_bad_mae_lm_params_are_one_line_naming_the_key(changes: dict, expected: str) -> None:
    assert_params_error(changes, expected)
