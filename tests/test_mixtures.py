"""Mixtures of objectives in one run (UniLM's three masks in one prefix LM, UL2's denoisers): each
micro-batch one component, drawn by share from the batch's own stream, so a batch stays a pure
function of (seed, index); FLOPs are the components' by share; a component an architecture cannot
take, or bad component params, are one line."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, PretrainSections, longest_read, objectives_params
from lmpipe.params.schema import parse
from lmpipe.pretraining import train_config
from lmpipe.runtime import StageError
from models import implementations
from models.architectures.base import architecture
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.objectives.base import batch_generator
from models.pretraining import PretrainModule, make_batch
from models.special import SPECIAL
from models.specs.objectives import OBJECTIVES

V = 400


def rows(n: int, length: int) -> torch.Tensor:
    return torch.randint(SPECIAL.n_special, V, (n, length), generator=torch.Generator().manual_seed(0))


def mask_of(batch: dict[str, torch.Tensor]) -> str:
    """Which of UniLM's masks a prefix-LM batch has: all prefix, none, or a split per row."""
    prefix = batch["prefix_lengths"]
    if bool((prefix == batch["input_ids"].shape[1]).all()):
        return "bidirectional"
    return "left_to_right" if bool((prefix == 0).all()) else "seq2seq"


def test_unilm_draws_its_three_masks_per_micro_batch_from_the_seeded_stream() -> None:
    train = train_config(
        "prefix_lm", "unilm", PretrainParams(seq_len=24, batch_size=4), objectives_params(), 3
    )
    assert train.row_length() == 25  # the longest component's rows: clm's and lm's
    data = rows(4, train.row_length())
    drawn = Counter(mask_of(make_batch(data, train, batch_generator(3, i), V)) for i in range(60))
    assert set(drawn) == {"bidirectional", "left_to_right", "seq2seq"} and min(drawn.values()) >= 10
    again = make_batch(data, train, batch_generator(3, 7), V)
    first = make_batch(data, train, batch_generator(3, 7), V)
    assert all(torch.equal(first[key], again[key]) for key in first)


@pytest.mark.parametrize(("arch", "objective"), [("prefix_lm", "unilm"), ("encoder_decoder", "ul2")])
def test_a_mixture_trains_and_its_flops_are_its_components_by_share(arch: str, objective: str) -> None:
    train = train_config(arch, objective, PretrainParams(seq_len=24, batch_size=4), objectives_params(), 1)
    model = ModelConfig(arch=arch, vocab_size=V, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=64)
    torch.manual_seed(0)
    module = PretrainModule(model, train)
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    first = last = None
    for index in range(12):  # several components, each seen more than once
        batch = make_batch(rows(4, train.row_length()), train, batch_generator(1, index % 4), V)
        loss, _, _ = module.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first, last = (loss.item() if first is None else first), loss.item()
    assert last < first
    parts = OBJECTIVES[objective].components(train.objective_params)
    assert sum(share for share, _, _ in parts) == pytest.approx(1.0)
    assert count_step_flops(model, train) == estimate_step_flops(model, train)
    one = train_config(
        arch, parts[0][1].name, PretrainParams(seq_len=24, batch_size=4), objectives_params(), 1
    )
    assert count_step_flops(model, train) != count_step_flops(model, one)


@pytest.mark.parametrize(("arch", "objective"), [("prefix_lm", "unilm"), ("encoder_decoder", "ul2")])
@pytest.mark.parametrize("seq_len", [64, 128, 512])
def test_no_component_makes_a_row_wider_than_the_max_len_it_was_checked_against(
    arch: str, objective: str, seq_len: int
) -> None:
    """UL2's x_64 at 15 % made 129 input tokens at seq_len 128 (T5's length helper counts no span where
    its mask makes one), and the pretraining stage crashed at the first such batch."""
    train = train_config(
        arch, objective, PretrainParams(seq_len=seq_len, batch_size=2), objectives_params(), 1
    )
    widest = longest_read(arch, objective, seq_len, train.objective_params)
    for _, component, own in OBJECTIVES[objective].components(train.objective_params):
        pair = implementations.objective(component.name).pair(
            rows(2, component.row_length(seq_len, own)), own, batch_generator(1, 0), V
        )
        batch = architecture(arch).batch(pair)
        read = [batch[key].shape[1] for key in ("input_ids", "decoder_input_ids") if key in batch]
        assert max(read) <= widest, (component.name, own, read, widest)


@pytest.mark.parametrize(
    ("model", "objectives", "message"),
    [
        (
            {"arch": "decoder", "objective": "unilm"},
            {},
            "models.m.objective: unilm's component mlm makes aligned pairs, which arch 'decoder' does "
            "not take",
        ),
        (
            {"arch": "prefix_lm", "objective": "unilm"},
            {"unilm": {"components": {"x": {"objective": "nope"}}}},
            "objectives.unilm: components.x.objective: 'nope' is not one (one of: mlm, clm",
        ),
        (
            {"arch": "encoder_decoder", "objective": "ul2"},
            {"ul2": {"components": {"r": {"objective": "span", "args": {"noise_density": 1.5}}}}},
            "objectives.ul2: components.r.args.noise_density=1.5: Input should be less than 1",
        ),
        (
            {"arch": "encoder_decoder", "objective": "ul2"},
            {"ul2": {"components": {"r": {"objective": "span", "weight": 0}}}},
            "objectives.ul2: components.r.weight: must be a number > 0, got 0",
        ),
        (
            {"arch": "encoder_decoder", "objective": "ul2"},
            {"ul2": {"components": {"s": {"objective": "lm", "args": {"noise_mask": "iid"}}}}},
            "objectives.ul2: components.s.args.noise_mask: unknown key",
        ),
    ],
)
def test_a_bad_mixture_is_one_line(model: dict, objectives: dict, message: str) -> None:
    with pytest.raises(StageError) as error:
        parse(PretrainSections, {"models": {"m": model}, "objectives": objectives})
    assert message in str(error.value) and "\n" not in str(error.value)
