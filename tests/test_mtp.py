"""Multi-token prediction: the rows carry the deeper labels, the next token's loss is the causal LM's on
the same weights, each depth sees only what its paper's form lets it see, the heads stay out of the
model, the FLOPs count equals the estimate, and bad params are one line naming the key."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.objectives.base import batch_generator
from models.pretraining import PretrainModule, make_batch
from models.special import SPECIAL
from models.specs.objectives.mtp import MTPParams
from models.transformer import Transformer, load_pretrained
from tests.pipeline_helpers import run_stages
from tests.test_pairs import assert_learns
from tests.test_params import assert_params_error
from tests.workdir import Workdir

MODEL = ModelConfig(arch="decoder", vocab_size=1000, d_model=64, n_layers=3, n_heads=4, d_ff=128, max_len=64)
SEQ_LEN = 32


def mtp(depth: int = 2, form: str = "parallel", arch: str = "decoder", **args):
    sections = objectives_params({"mtp": {"depth": depth, "form": form, **args}})
    return train_config(arch, "mtp", PretrainParams(seq_len=SEQ_LEN, batch_size=4), sections, 3)


def rows_for(train, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(SPECIAL.n_special, 1000, (4, train.row_length()), generator=generator)


def test_a_row_is_the_causal_lms_and_its_deeper_labels_ride_beside_it() -> None:
    train = mtp(depth=3)
    assert train.row_length() == SEQ_LEN + 1 + 3
    rows = rows_for(train)
    batch = make_batch(rows, train, batch_generator(3, 0), 1000)
    assert torch.equal(batch["input_ids"], rows[:, :SEQ_LEN])
    assert torch.equal(batch["labels"], rows[:, 1 : SEQ_LEN + 1])
    assert torch.equal(batch["future_ids"], rows[:, SEQ_LEN + 1 :])


@pytest.mark.parametrize("form", ["parallel", "sequential"])
@pytest.mark.parametrize("arch", ["decoder", "prefix_lm"])
def test_the_next_tokens_loss_is_the_causal_lms_on_the_same_weights(form: str, arch: str) -> None:
    """The model alone is a plain decoder: its last block is the parallel form's first head, and the
    sequential modules come after it."""
    model = MODEL.with_(arch=arch)
    train = mtp(form=form, arch=arch)
    clm = train_config(arch, "clm", PretrainParams(seq_len=SEQ_LEN, batch_size=4), objectives_params(), 3)
    rows = rows_for(train)
    torch.manual_seed(0)
    module = PretrainModule(model, train).eval()
    plain = PretrainModule(model, clm).eval()
    plain.model.load_state_dict(module.model.state_dict())
    with torch.no_grad():
        terms = module.terms(make_batch(rows, train, batch_generator(3, 0), 1000))
        expected = plain.terms(make_batch(rows[:, : SEQ_LEN + 1], clm, batch_generator(3, 0), 1000))
    torch.testing.assert_close(terms.loss, expected.loss)
    assert terms.correct == expected.correct and terms.count == expected.count == 4 * SEQ_LEN
    assert set(terms.extra) == {"ahead_2", "ahead_3"} and set(terms.accuracies) == {"ahead_2", "ahead_3"}


@pytest.mark.parametrize("form", ["parallel", "sequential"])
def test_each_depth_sees_no_token_past_the_one_before_its_label(form: str) -> None:
    """The prediction of the token k + 1 ahead of position i reads the tokens up to i (parallel: each
    head on the trunk's states), or up to i + k (sequential: module k embeds the token k ahead, the
    causal chain kept): changing the last of those moves it, changing a later one but its label does
    not."""
    train = mtp(depth=2, form=form)
    torch.manual_seed(0)
    module = PretrainModule(MODEL, train).eval()
    rows = rows_for(train)

    def logits(rows: torch.Tensor) -> list[torch.Tensor]:
        batch = make_batch(rows, train, batch_generator(3, 0), 1000)
        with torch.no_grad():
            return [
                module.model.lm_logits(s) for s in module.objective_head.depth_states(module.model, batch)
            ]

    base, position = logits(rows), 10
    for k in range(3):
        last = position + (k if form == "sequential" else 0)
        unread = next(t for t in itertools.count(last + 1) if t != position + 1 + k)
        for changed, moves in ((last, True), (unread, False)):
            other = rows.clone()
            other[:, changed] = SPECIAL.n_special + (other[:, changed] + 1 - SPECIAL.n_special) % 900
            moved = not torch.equal(logits(other)[k][:, position], base[k][:, position])
            assert moved == moves, (k, changed)


@pytest.mark.parametrize("form", ["parallel", "sequential"])
def test_the_heads_train_beside_the_model_and_stay_out_of_it(form: str) -> None:
    train = mtp(form=form)
    batch = make_batch(rows_for(train), train, batch_generator(3, 0), 1000)
    module = assert_learns(MODEL, train, batch, steps=6)
    assert len(module.objective_head.blocks) == 2
    assert not any(name.startswith("objective_head") for name in module.model.state_dict())


def test_each_forms_weights_are_its_papers_unless_set() -> None:
    assert MTPParams(depth=2).depth_weight() == 1.0  # Gloeckle et al.: the losses summed
    assert MTPParams(depth=2, form="sequential").depth_weight() == pytest.approx(0.15)  # λ/D, λ 0.3
    assert MTPParams(depth=2, form="sequential", weight=0.5).depth_weight() == 0.5
    train = mtp(depth=2, form="sequential")
    torch.manual_seed(0)
    module = PretrainModule(MODEL, train)
    terms = module.terms(make_batch(rows_for(train), train, batch_generator(3, 0), 1000))
    extra = sum(0.15 * loss for loss, _ in terms.extra.values())
    torch.testing.assert_close(terms.total(), terms.loss + extra)


@pytest.mark.parametrize("form", ["parallel", "sequential"])
@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"embedding_size": 32, "positions": "rope", "norm": "rmsnorm", "mlp": "swiglu"},
        {"norm_position": "post", "lm_head": "transform", "positions": "sinusoidal"},
    ],
    ids=["gpt", "factorized-rope", "post-ln"],
)
def test_the_flops_count_includes_every_head_and_equals_the_estimate(
    form: str, depth: int, changes: dict
) -> None:
    model, train = MODEL.with_(**changes), mtp(depth=depth, form=form)
    counted = count_step_flops(model, train)
    assert counted == estimate_step_flops(model, train)
    clm = train_config(
        "decoder", "clm", PretrainParams(seq_len=SEQ_LEN, batch_size=4), objectives_params(), 3
    )
    assert counted > count_step_flops(model, clm)
    if depth > 1:
        assert counted > count_step_flops(model, mtp(depth=depth - 1, form=form))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"objectives": {"mtp": {"depth": 0}}},
            "objectives.mtp.depth=0: Input should be greater than or equal to 1",
        ),
        ({"objectives": {"mtp": {"form": "tree"}}}, "objectives.mtp.form='tree'"),
        (
            {"objectives": {"mtp": {"weight": 0.0}}},
            "objectives.mtp.weight=0.0: Input should be greater than 0",
        ),
        (
            {"models": {"encoder_mlm": {"objective": "mtp"}}},
            "models.encoder_mlm.objective='mtp': does not fit arch 'encoder'",
        ),
        (
            {"objectives": {"unilm": {"components": {"left_to_right": {"objective": "mtp"}}}}},
            "components.left_to_right: mtp trains a head of its own",
        ),
    ],
)
def test_bad_mtp_params_are_one_line_naming_the_key(changes: dict, expected: str) -> None:
    assert_params_error(changes, expected)


def test_the_stage_trains_both_forms_and_keeps_a_plain_decoder(sample_pipeline: Workdir) -> None:
    """pretrain@<model> trains the heads beside the model and logs each depth's loss; the final model is
    the plain decoder, every head left out."""
    settings = {
        "models": {
            "parallel": {"arch": "decoder", "objective": "mtp", "preset": "tiny"},
            "sequential": {"arch": "decoder", "objective": "mtp", "preset": "tiny"},
        },
        "objectives.mtp.depth": 2,
        "pretrain.max_steps": 4,
        "pretrain.warmup_steps": 0,
        "pretrain.val_every": 4,
        "pretrain.checkpoint_every": 4,
    }
    for form in ("parallel", "sequential"):
        with sample_pipeline.changed(settings | {"objectives.mtp.form": form}):
            run_stages(sample_pipeline, "pretrain", form)
        result = json.loads((sample_pipeline.path / f"metrics/pretrain/{form}.json").read_text())
        assert result["steps"] == 4 and np.isfinite(result["val_loss"])
        model, config = load_pretrained(sample_pipeline.path / f"checkpoints/{form}/final")
        assert config["objective"] == "mtp" and model.cfg.arch == "decoder"
        plain = Transformer(model.cfg)
        assert model.state_dict().keys() == plain.state_dict().keys()
