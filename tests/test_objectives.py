"""The objectives as pure functions: rates and splits, specials, exact span arithmetic, seeding."""

from __future__ import annotations

import pytest
import torch

from models import implementations
from models.objectives.base import batch_generator
from models.objectives.mlm import mask_tokens
from models.objectives.noise import random_spans_noise_mask
from models.objectives.span import span_corrupt
from models.special import SPECIAL
from models.specs.objectives import ObjectiveParams
from models.specs.objectives.bert_style import BertStyleParams
from models.specs.objectives.mlm import MLMParams
from models.specs.objectives.span import span_corruption_lengths

V = 5000


def corpus_rows(rows: int = 1000, length: int = 128, seed: int = 0) -> torch.Tensor:
    """Random ordinary ids with specials and padding sprinkled in, as in packed real rows."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(SPECIAL.n_special, V, (rows, length), generator=g)
    sprinkle = torch.rand(tokens.shape, generator=g)
    tokens[sprinkle < 0.05] = SPECIAL.eos
    tokens[(sprinkle >= 0.05) & (sprinkle < 0.08)] = SPECIAL.pad
    tokens[(sprinkle >= 0.08) & (sprinkle < 0.09)] = SPECIAL.cls
    return tokens


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_mlm_rate_split_and_specials(rate: float) -> None:
    tokens = corpus_rows()
    original = tokens.clone()
    batch = mask_tokens(tokens, batch_generator(1, 0), V, rate=rate)
    assert torch.equal(tokens, original)  # the input is left alone
    flat, inputs = tokens.reshape(-1), batch.input_ids.reshape(-1)
    ordinary = flat >= SPECIAL.n_special
    assert ordinary.sum() > 100_000
    assert abs(len(batch.positions) / ordinary.sum().item() - rate) < 0.005
    assert bool(ordinary[batch.positions].all())  # never a special or pad token
    assert torch.equal(batch.labels, flat[batch.positions])
    assert torch.equal(batch.positions, batch.positions.sort().values)
    unselected = torch.ones_like(flat, dtype=torch.bool)
    unselected[batch.positions] = False
    assert torch.equal(inputs[unselected], flat[unselected])
    chosen = inputs[batch.positions]
    masked = (chosen == SPECIAL.mask).float().mean().item()
    kept = (chosen == batch.labels).float().mean().item()
    replaced = ((chosen != SPECIAL.mask) & (chosen != batch.labels)).float().mean().item()
    # a random replacement equals the original with probability 1/(V - n_special)
    assert abs(masked - 0.8) < 0.01 and abs(replaced - 0.1) < 0.01 and abs(kept - 0.1) < 0.01
    assert bool((chosen[chosen != SPECIAL.mask] >= SPECIAL.n_special).all())  # no special is inserted


def test_mlm_all_mask_and_argument_checks() -> None:
    batch = mask_tokens(corpus_rows(10), batch_generator(0, 0), V, mask_fraction=1.0, random_fraction=0.0)
    assert bool((batch.input_ids.reshape(-1)[batch.positions] == SPECIAL.mask).all())
    with pytest.raises(ValueError, match="vocab_size"):
        mask_tokens(corpus_rows(2), batch_generator(0, 0), 100)
    # the shares are the params' to check, once, for every objective that replaces as BERT does
    for params in (MLMParams, BertStyleParams):
        with pytest.raises(ValueError, match="mask_fraction \\+ random_fraction must be <= 1"):
            params(mask_fraction=0.9, random_fraction=0.2).check()


def test_masks_depend_on_the_seed_and_the_micro_batch_index_only() -> None:
    tokens = corpus_rows(8)

    def masks(seed: int, index: int) -> torch.Tensor:
        return mask_tokens(tokens, batch_generator(seed, index), V).input_ids

    assert torch.equal(masks(7, 3), masks(7, 3))
    for other in [(8, 3), (7, 4)]:
        assert not torch.equal(masks(7, 3), masks(*other)), other


def test_causal_lm_targets_are_the_next_tokens() -> None:
    from models.architectures.base import architecture

    tokens = corpus_rows(3, 17)
    pair = implementations.objective("clm").pair(tokens, ObjectiveParams(), batch_generator(0, 0), V)
    batch = architecture("decoder").batch(pair)
    inputs, targets = batch["input_ids"], batch["labels"]
    assert inputs.shape == targets.shape == (3, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and torch.equal(targets[:, -1], tokens[:, -1])


def test_span_lengths_are_t5s() -> None:
    assert span_corruption_lengths(512, 0.15, 3.0) == (568, 114)
    assert span_corruption_lengths(128, 0.15, 3.0) == (141, 29)
    raw, targets = span_corruption_lengths(128, 0.5, 3.0)
    assert targets <= 128


def rebuild(inputs: torch.Tensor, targets: torch.Tensor) -> list[int]:
    """The original row from a corrupted pair: every sentinel in the inputs replaced by its span."""
    spans: dict[int, list[int]] = {}
    current = None
    for token in targets.tolist()[:-1]:
        if SPECIAL.first_sentinel <= token < SPECIAL.n_special:
            current = token
            spans[current] = []
        else:
            spans[current].append(token)
    out: list[int] = []
    for token in inputs.tolist()[:-1]:
        out.extend(spans[token] if SPECIAL.first_sentinel <= token < SPECIAL.n_special else [token])
    return out


@pytest.mark.parametrize(
    ("length", "density", "mean"),
    [
        (141, 0.15, 3.0),
        (568, 0.15, 3.0),
        (64, 0.5, 3.0),
        (200, 0.01, 3.0),
        (50, 0.15, 1.0),
        (2, 0.15, 3.0),
        (3, 0.15, 3.0),
        (5, 0.5, 2.0),
        (300, 0.3, 8.0),
    ],
)
def test_span_corruption_rebuilds_the_original_exactly(length: int, density: float, mean: float) -> None:
    tokens = torch.randint(
        SPECIAL.n_special, V, (16, length), generator=torch.Generator().manual_seed(length)
    )
    batch = span_corrupt(tokens, batch_generator(0, length), density, mean)
    num_noise = min(max(round(length * density), 1), length - 1)
    num_spans = min(max(round(num_noise / mean), 1), num_noise, length - num_noise)
    assert batch.input_ids.shape == (16, length - num_noise + num_spans + 1)
    assert batch.target_ids.shape == (16, num_noise + num_spans + 1)
    for row, inputs, targets in zip(tokens, batch.input_ids, batch.target_ids, strict=True):
        assert rebuild(inputs, targets) == row.tolist()
        sentinels = [t for t in targets.tolist() if SPECIAL.first_sentinel <= t < SPECIAL.n_special]
        assert sentinels == [SPECIAL.sentinel(i) for i in range(num_spans)]
        assert inputs[-1] == targets[-1] == SPECIAL.eos


def test_span_corruption_gives_exact_input_lengths() -> None:
    for inputs_length in (128, 512):
        raw, targets_length = span_corruption_lengths(inputs_length, 0.15, 3.0)
        tokens = torch.randint(SPECIAL.n_special, V, (4, raw), generator=torch.Generator().manual_seed(1))
        batch = span_corrupt(tokens, batch_generator(0, 0))
        assert batch.input_ids.shape == (4, inputs_length) and batch.target_ids.shape == (4, targets_length)


def test_noise_mask_spans() -> None:
    for seed in range(50):
        mask = random_spans_noise_mask(100, 0.15, 3.0, batch_generator(seed, 0))
        assert mask.sum() == 15 and not mask[0]
        starts = mask & ~torch.cat([torch.zeros(1, dtype=torch.bool), mask[:-1]])
        assert starts.sum() == 5  # every one of round(15 / 3) spans is non-empty
    assert torch.equal(
        random_spans_noise_mask(100, 0.15, 3.0, batch_generator(1, 2)),
        random_spans_noise_mask(100, 0.15, 3.0, batch_generator(1, 2)),
    )
    assert random_spans_noise_mask(1, 0.15, 3.0, batch_generator(0, 0)).shape == (1,)


def test_spans_past_the_last_sentinel_share_it() -> None:
    """T5's corruption-rate table at 512 tokens: 50 % in spans of 3 is 128 spans, 100 sentinels."""
    raw, _ = span_corruption_lengths(512, 0.5, 3.0)
    tokens = torch.randint(SPECIAL.n_special, V, (2, raw), generator=torch.Generator().manual_seed(0))
    batch = span_corrupt(tokens, batch_generator(0, 0), 0.5, 3.0)
    for inputs, targets in zip(batch.input_ids, batch.target_ids, strict=True):
        sentinels = inputs[(inputs >= SPECIAL.first_sentinel) & (inputs < SPECIAL.n_special)].tolist()
        assert len(sentinels) == 128
        assert sentinels == [SPECIAL.sentinel(min(i, 99)) for i in range(128)]
        assert (
            targets[(targets >= SPECIAL.first_sentinel) & (targets < SPECIAL.n_special)].tolist() == sentinels
        )


def test_every_objective_is_registered_once_and_named_alike_everywhere() -> None:
    """One module per objective in the registry; params.yaml's `objectives` sections are derived from
    it, each validated by the objective's own params class."""
    from lmpipe.params.pretrain import objectives_params
    from models.specs.objectives import OBJECTIVES

    sections = objectives_params()
    assert set(OBJECTIVES) == set(type(sections).model_fields)
    for name, objective in OBJECTIVES.items():
        section = getattr(sections, name)
        assert objective.name == name and objective.Params(**section.model_dump()) == objective.Params()
