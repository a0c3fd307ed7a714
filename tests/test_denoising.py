"""T5's denoising variants (BERT-style, MASS-style, replace spans i.i.d. or of a mean length, drop
corrupted tokens) and BART's noise functions: each pair checked against the row it was made from, a
pure function of (rows, seed), trained on every architecture it fits; pairs wider than the model are
one line naming the key."""

from __future__ import annotations

import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, PretrainSections, objectives_params, section_params
from lmpipe.params.schema import parse
from lmpipe.pretraining import train_config
from lmpipe.runtime import StageError
from models import implementations
from models.config import ModelConfig
from models.objectives.base import batch_generator
from models.objectives.noise import iid_noise_mask
from models.pretraining import make_batch
from models.special import SPECIAL
from models.specs.objectives import OBJECTIVES, ObjectiveParams
from models.specs.objectives.noise import noise_count
from tests.test_pairs import assert_learns

V = 500
EOS, MASK = SPECIAL.eos, SPECIAL.mask


def rows(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(SPECIAL.n_special, V, (n, length), generator=torch.Generator().manual_seed(seed))


def args(objective: str, **values) -> ObjectiveParams:
    return section_params(objectives_params({objective: values}), objective)


def pair(objective: str, tokens: torch.Tensor, seed: int = 0, **values):
    return implementations.objective(objective).pair(
        tokens, args(objective, **values), batch_generator(seed, 0), V
    )


def real(tokens: torch.Tensor, lengths: torch.Tensor | None, i: int) -> list[int]:
    return tokens[i, : None if lengths is None else int(lengths[i])].tolist()


def is_subsequence(part: list[int], whole: list[int]) -> bool:
    it = iter(whole)
    return all(token in it for token in part)


def test_iid_noise_is_a_fixed_count_of_independent_positions() -> None:
    hits = torch.zeros(50)
    for seed in range(400):
        mask = iid_noise_mask(50, 0.2, batch_generator(seed, 0))
        assert int(mask.sum()) == 10
        hits += mask
    assert hits.min() > 40 and hits.max() < 120  # every position about as often (80 expected)


@pytest.mark.parametrize("noise_mask", ["iid", "random_spans"])
def test_bert_style_predicts_the_whole_row_and_mass_style_masks_every_noise_token(noise_mask: str) -> None:
    tokens = rows(8, 63)
    bert = pair("bert_style", tokens, noise_mask=noise_mask)
    original = torch.cat([tokens, torch.full((8, 1), EOS)], dim=1)
    assert torch.equal(bert.targets, original) and bert.inputs.shape == original.shape
    changed = (bert.inputs != original).sum(1)
    assert bool((changed <= noise_count(63, 0.15)).all()) and bool((changed > 0).all())
    mass = pair("bert_style", tokens, noise_mask=noise_mask, mask_fraction=1.0, random_fraction=0.0)
    assert bool(((mass.inputs == MASK).sum(1) == noise_count(63, 0.15)).all())
    kept = mass.inputs != MASK
    assert torch.equal(mass.inputs[kept], original[kept])


@pytest.mark.parametrize("noise_mask", ["iid", "random_spans"])
def test_drop_splits_each_row_into_its_kept_and_its_noise_tokens(noise_mask: str) -> None:
    objective = OBJECTIVES["drop"]  # the declaration: its row length and widths
    raw = objective.row_length(32, args("drop"))
    tokens = rows(8, raw)
    dropped = pair("drop", tokens, noise_mask=noise_mask)
    assert dropped.inputs.shape[1] == 32
    assert (dropped.inputs.shape[1], dropped.targets.shape[1]) == objective.widths(32, args("drop"))[:2]
    made = zip(tokens.tolist(), dropped.inputs.tolist(), dropped.targets.tolist(), strict=True)
    for row, inputs, targets in made:
        assert inputs[-1] == targets[-1] == EOS
        assert is_subsequence(inputs[:-1], row) and is_subsequence(targets[:-1], row)
        assert sorted(inputs[:-1] + targets[:-1]) == sorted(row)


def test_iid_span_corruption_numbers_every_span_from_the_first_token_on() -> None:
    tokens = rows(16, 40)
    spans = pair("span", tokens, seed=3, noise_mask="iid", noise_density=0.3)
    assert spans.input_lengths is not None and spans.target_lengths is not None
    for i, row in enumerate(tokens.tolist()):
        inputs = real(spans.inputs, spans.input_lengths, i)
        targets = real(spans.targets, spans.target_lengths, i)
        fills, current = {}, None
        for token in targets[:-1]:
            if SPECIAL.first_sentinel <= token < SPECIAL.n_special:
                current = fills.setdefault(token, [])
            else:
                current.append(token)  # a row starting with noise still starts its targets with a sentinel
        rebuilt = [t for token in inputs[:-1] for t in fills.get(token, [token])]
        assert rebuilt == row and sum(map(len, fills.values())) == noise_count(40, 0.3)
    assert max(spans.inputs.shape[1], 1) <= 40


@pytest.mark.parametrize("seed", range(5))
def test_bart_noises_rebuild_to_the_row(seed: int) -> None:
    tokens = rows(6, 59, seed)
    original = torch.cat([tokens, torch.full((6, 1), EOS)], dim=1)
    n = noise_count(59, 0.3)
    for noise in ("token_masking", "token_deletion", "text_infilling", "document_rotation"):
        noised = pair("bart", tokens, seed, noise=noise)
        assert torch.equal(noised.targets, original), noise
        for i, row in enumerate(tokens.tolist()):
            inputs = real(noised.inputs, noised.input_lengths, i)
            assert inputs[-1] == EOS
            inputs = inputs[:-1]
            if noise == "token_masking":
                assert inputs.count(MASK) == n
                assert all(a in (b, MASK) for a, b in zip(inputs, row, strict=True))
            elif noise == "token_deletion":
                assert len(inputs) == 59 - n and is_subsequence(inputs, row)
            elif noise == "text_infilling":
                kept = [token for token in inputs if token != MASK]
                assert len(kept) == 59 - n and is_subsequence(kept, row)
                assert 1 <= inputs.count(MASK) <= n
                # spans never merge
                assert all(not (a == b == MASK) for a, b in zip(inputs, inputs[1:], strict=False))
            else:
                start = inputs.index(row[0]) if row.count(row[0]) == 1 else None
                assert start is None or inputs[start:] + inputs[:start] == row


STOP = V - 1  # a sentence's end in these rows' vocabulary
ENDS = torch.zeros(V, dtype=torch.bool)
ENDS[: SPECIAL.n_special] = ENDS[STOP] = True


def sentences_of(tokens: list[int]) -> list[list[int]]:
    out, current = [], []
    for i, token in enumerate(tokens):
        current.append(token)
        if ENDS[token] and (i + 1 == len(tokens) or not ENDS[tokens[i + 1]]):
            out, current = [*out, current], []
    return out + [current] if current else out


def test_sentence_permutation_moves_whole_sentences_then_the_noise_applies() -> None:
    """BART's sentence permutation (fairseq's `permute_sentences`): the row's sentences, each ending
    after its run of sentence-end pieces, in another order; then the noise function, as fairseq
    orders them; the targets the row as it was."""
    tokens = rows(8, 59)
    tokens[:, 5::9] = tokens[:, 13] = tokens[:, -1] = STOP  # 13 and 14: a run of two ends one sentence
    original = torch.cat([tokens, torch.full((8, 1), EOS)], dim=1)
    values = {"noise": "none", "permute_sentences": 1.0}

    def noised(**changes):
        given = args("bart", **(values | changes))
        pieces = {"sentence_ends": ENDS}
        return implementations.objective("bart").pair(tokens, given, batch_generator(0, 0), V, pieces)

    shuffled = noised()
    assert torch.equal(shuffled.targets, original)
    moved = 0
    for i, row in enumerate(tokens.tolist()):
        inputs = real(shuffled.inputs, shuffled.input_lengths, i)[:-1]
        parts = sentences_of(row)
        assert len(parts) == 7 and sorted(sentences_of(inputs)) == sorted(parts)
        moved += inputs != row
    assert moved >= 7
    half = noised(permute_sentences=0.3)
    for i, row in enumerate(tokens.tolist()):  # ceil(0.3 × 7) = 3 sentences drawn, the rest in place
        inputs = real(half.inputs, half.input_lengths, i)[:-1]
        assert sum(a != b for a, b in zip(sentences_of(inputs), sentences_of(row), strict=True)) <= 3
    infilled = noised(noise="text_infilling")
    assert torch.equal(infilled.targets, original)
    kept = (infilled.inputs != MASK) & (infilled.inputs != EOS) & (infilled.inputs != SPECIAL.pad)
    assert (kept.sum(1) == 59 - noise_count(59, 0.3)).all()


def test_sentence_permutation_reads_the_tokenizers_sentence_ends() -> None:
    train = train_config(
        "encoder_decoder",
        "bart",
        PretrainParams(seq_len=24, batch_size=4),
        objectives_params({"bart": {"noise": "none", "permute_sentences": 1.0}}),
        2,
    )
    with pytest.raises(ValueError, match="objective bart reads the tokenizer's sentence_ends: not given"):
        make_batch(rows(4, train.row_length()), train, batch_generator(2, 0), V)


def test_text_infilling_spans_are_poisson_lengths() -> None:
    """About one span per λ noise tokens: the [MASK]s of many rows against the noise they replace."""
    tokens = rows(64, 200)
    masks = (pair("bart", tokens, noise="text_infilling").inputs == MASK).sum().item()
    expected = 64 * noise_count(200, 0.3) / 3.0
    assert 0.8 * expected < masks < 1.25 * expected


def test_deshuffling_reads_the_rows_tokens_in_another_order_and_rebuilds_the_row() -> None:
    """T5's deshuffling: the inputs are the row's tokens permuted (all of them, as T5's code draws it),
    the targets the row as it was; both end in EOS."""
    objective = OBJECTIVES["deshuffle"]
    tokens = rows(8, objective.row_length(32, args("deshuffle")))
    shuffled = pair("deshuffle", tokens)
    original = torch.cat([tokens, torch.full((8, 1), EOS)], dim=1)
    assert torch.equal(shuffled.targets, original) and shuffled.inputs.shape == original.shape
    assert (shuffled.inputs.shape[1], shuffled.targets.shape[1]) == objective.widths(32, args("deshuffle"))[
        :2
    ]
    assert torch.equal(shuffled.inputs.sort(1).values, original.sort(1).values)
    assert not torch.equal(shuffled.inputs, original)


@pytest.mark.parametrize("objective", ["bert_style", "drop", "span", "bart", "deshuffle"])
def test_a_pair_is_a_pure_function_of_rows_and_seed(objective: str) -> None:
    tokens = rows(4, 40)
    values = {"noise_mask": "iid"} if objective == "span" else {}
    first, again, other = (pair(objective, tokens, seed, **values) for seed in (5, 5, 6))
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)
    assert not torch.equal(first.inputs, other.inputs)


VARIANTS = [
    ("span", {"noise_mask": "iid"}),
    ("bert_style", {"noise_mask": "random_spans"}),
    ("drop", {"noise_mask": "random_spans"}),
    ("bart", {"noise": "token_masking"}),
    ("bart", {"noise": "token_deletion"}),
    ("bart", {"noise": "document_rotation"}),
    ("bart", {"noise": "none", "permute_sentences": 1.0}),
    ("bart", {"noise": "text_infilling", "permute_sentences": 1.0}),
    ("deshuffle", {}),
]


@pytest.mark.parametrize("arch", ["encoder_decoder", "prefix_lm"])
@pytest.mark.parametrize(("objective", "values"), VARIANTS)
def test_each_variant_trains_and_its_flops_are_counted(arch: str, objective: str, values: dict) -> None:
    """The variants the default params do not reach (those are in tests/test_pairs.py)."""
    train = train_config(
        arch, objective, PretrainParams(seq_len=24, batch_size=4), objectives_params({objective: values}), 2
    )
    model = ModelConfig(arch=arch, vocab_size=V, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=64)
    batch = make_batch(
        rows(4, train.row_length()), train, batch_generator(2, 0), V, pieces={"sentence_ends": ENDS}
    )
    assert_learns(model, train, batch)


@pytest.mark.parametrize(
    ("model", "objectives", "message"),
    [
        (
            {"arch": "decoder", "objective": "bart"},
            {},
            "models.m.max_len (128) is shorter than the 255 tokens arch 'decoder' reads of a row of "
            "objective 'bart' at pretrain.seq_len 128",
        ),
        ({"arch": "prefix_lm", "objective": "bart", "max_len": 256}, {}, None),
        (
            {"arch": "encoder_decoder", "objective": "span", "max_len": 256},
            {"span": {"noise_mask": "iid", "noise_density": 0.5}},
            "models.m.max_len (256) is shorter than the 257 tokens arch 'encoder_decoder' reads of a "
            "row of objective 'span' at pretrain.seq_len 256",
        ),
        (
            {"arch": "encoder_decoder", "objective": "bart"},
            {"bart": {"noise": "text_infilling", "noise_density": 0.6}},
            "objectives.bart: text_infilling places its spans between kept tokens",
        ),
        (
            {"arch": "encoder_decoder", "objective": "bart"},
            {"bart": {"noise": "none"}},
            "objectives.bart: noise none with permute_sentences 0 corrupts nothing",
        ),
    ],
)
def test_a_pair_wider_than_the_model_is_one_line(model: dict, objectives: dict, message: str | None) -> None:
    seq_len = 256 if objectives.get("span") else 128
    raw = {"models": {"m": model}, "objectives": objectives, "pretrain": {"seq_len": seq_len}}
    if message is None:
        parse(PretrainSections, raw)
        return
    with pytest.raises(StageError) as error:
        parse(PretrainSections, raw)
    assert message in str(error.value) and "\n" not in str(error.value)
