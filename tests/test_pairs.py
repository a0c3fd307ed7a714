"""Objectives and architectures independent, as in T5's code: every objective makes (inputs, targets),
every architecture's feature converter makes its batch of them; every pair a converter can express
trains, the others are one line naming the params key; a new objective and a new architecture are a
module each."""

from __future__ import annotations

import itertools
import textwrap

import pytest
import torch

from lmpipe.params.pretrain import PretrainSections
from lmpipe.params.schema import parse
from lmpipe.pretraining import train_config
from lmpipe.runtime import StageError
from models import implementations
from models.architectures.base import architecture
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.objectives.base import batch_generator
from models.objectives.span import span_corrupt
from models.pair import Pair
from models.pretraining import PretrainModule, make_batch
from models.special import SPECIAL
from models.specs.architectures import ARCHITECTURES
from models.specs.objectives import OBJECTIVES
from models.specs.objectives.lm import LMParams, prefix_bounds
from models.transformer import Transformer, attention_mask

VOCAB = 400


def needs(objective: str) -> dict:
    """The model values an objective needs, each as the values it allows (a declaration's defaults)."""
    spec = OBJECTIVES[objective]
    wanted = spec.model_needs(spec.Params())
    return {key: value if isinstance(value, tuple) else (value,) for key, value in wanted.items()}


FITTING = [
    (arch, objective)
    for arch, objective in itertools.product(ARCHITECTURES, OBJECTIVES)
    if OBJECTIVES[objective].kind in ARCHITECTURES[arch].fits
    and arch in needs(objective).get("arch", (arch,))
]


def rows(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(SPECIAL.n_special, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def assert_learns(
    model: ModelConfig, train, batch: dict[str, torch.Tensor], steps: int = 6
) -> PretrainModule:
    """A few steps on one batch lower its loss (with a pair head, the sum), and the FLOPs counted equal
    the estimate. Returns the trained module."""
    torch.manual_seed(0)
    module = PretrainModule(model, train)
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss, _, _ = module.training_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert count_step_flops(model, train) == estimate_step_flops(model, train)
    return module


def test_prefix_mask_sees_the_whole_prefix_and_causally_after_it() -> None:
    mask = attention_mask(None, True, 6, torch.device("cpu"), torch.tensor([2, 4]))[:, 0]
    for row, prefix in enumerate((2, 4)):
        for query, key in itertools.product(range(6), range(6)):
            in_prefix = query < prefix
            expected = key < prefix if in_prefix else key <= query
            assert bool(mask[row, query, key]) == expected, (row, query, key)


def test_a_prefix_token_moves_every_position_and_a_target_only_those_after_it() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="prefix_lm", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, d_ff=64)
    model = Transformer(cfg).eval()
    ids, prefix = rows(1, 8), torch.tensor([3])
    base = model(ids, prefix_lengths=prefix)
    for changed in range(8):
        other = ids.clone()
        other[0, changed] = SPECIAL.n_special + (int(ids[0, changed]) + 1 - SPECIAL.n_special) % 50
        moved = ((model(other, prefix_lengths=prefix) - base).abs().amax(-1)[0] > 1e-6).tolist()
        expected = [changed < 3 or position >= changed for position in range(8)]
        assert moved == expected, changed


def test_decoder_reads_a_pair_concatenated_and_scores_its_targets_only() -> None:
    spans = span_corrupt(rows(3, 40), batch_generator(0, 0), 0.15, 3.0)
    pair = Pair(spans.input_ids, spans.target_ids)
    batch = architecture("decoder").batch(pair)
    width_in, width_out = pair.inputs.shape[1], pair.targets.shape[1]
    assert torch.equal(batch["input_ids"], torch.cat([pair.inputs, pair.targets], 1)[:, :-1])
    assert torch.equal(batch["labels"], pair.targets.reshape(-1))
    first = batch["positions"].view(3, width_out)[:, 0] % (width_in + width_out - 1)
    assert torch.equal(first, torch.full((3,), width_in - 1))  # the last input predicts the first target
    prefix = architecture("prefix_lm").batch(pair)
    assert torch.equal(prefix["prefix_lengths"], torch.full((3,), width_in))


def test_lm_objective_splits_rows_and_every_converter_restores_them() -> None:
    source = rows(64, 33)
    pair = implementations.objective("lm").pair(
        source, LMParams(noise_density=0.5), batch_generator(1, 0), VOCAB
    )
    fewest, most = prefix_bounds(33, 0.5)
    assert (fewest, most) == (1, 32)
    assert int(pair.input_lengths.min()) >= 1 and int(pair.input_lengths.max()) <= 32
    assert torch.equal(pair.input_lengths + pair.target_lengths, torch.full((64,), 33))
    for b in range(64):
        split = int(pair.input_lengths[b])
        assert torch.equal(pair.inputs[b, :split], source[b, :split])
        assert torch.equal(pair.targets[b, : 33 - split], source[b, split:])
        assert bool((pair.inputs[b, split:] == SPECIAL.pad).all())
    decoder = architecture("decoder").batch(pair)
    assert torch.equal(decoder["input_ids"], source[:, :-1])
    assert len(decoder["positions"]) == int(pair.target_lengths.sum())
    encdec = architecture("encoder_decoder").batch(pair)
    assert torch.equal(encdec["pad_mask"].sum(1), pair.input_lengths)
    assert torch.equal(encdec["labels"], pair.targets[pair.targets != SPECIAL.pad])


@pytest.mark.parametrize(("arch", "objective"), FITTING)
def test_every_fitting_pair_trains_and_its_flops_are_counted(arch: str, objective: str) -> None:
    from lmpipe.params.pretrain import PretrainParams, objectives_params

    run = PretrainParams(seq_len=24, batch_size=4)
    train = train_config(arch, objective, run, objectives_params(), seed=2)
    positions = needs(objective).get("positions", ARCHITECTURES[arch].positions or ("learned",))[0]
    model = ModelConfig(
        arch=arch,
        vocab_size=VOCAB,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        max_len=96,
        positions=positions,
    )
    parts = OBJECTIVES[objective].components(train.objective_params)
    tables = {name for _, part, own in parts for name in part.piece_tables(own)}
    pieces = {name: torch.arange(VOCAB) % 3 != 1 for name in tables}  # two pieces in three start a word
    batch = make_batch(rows(4, train.row_length()), train, batch_generator(2, 0), VOCAB, pieces=pieces)
    assert_learns(model, train, batch)


def params_with(arch: str, objective: str, **objectives) -> dict:
    return {"models": {"m": {"arch": arch, "objective": objective}}, "objectives": objectives}


@pytest.mark.parametrize(
    ("arch", "objective", "message"),
    [
        ("decoder", "mlm", "models.m.objective='mlm': does not fit arch 'decoder'"),
        ("encoder", "span", "models.m.objective='span': does not fit arch 'encoder'"),
        ("encoder_decoder", "clm", "models.m.objective='clm': does not fit arch 'encoder_decoder'"),
        ("transformer", "mlm", "models.m.arch='transformer': unknown architecture"),
        ("encoder", "bert", "models.m.objective='bert': unknown objective"),
    ],
)
def test_an_impossible_or_unknown_pair_is_one_line(arch: str, objective: str, message: str) -> None:
    with pytest.raises(StageError) as error:
        parse(PretrainSections, params_with(arch, objective))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_objective_params_are_validated_by_the_objectives_own_class() -> None:
    with pytest.raises(StageError, match=r"objectives\.lm\.noise_density=1\.0"):
        parse(PretrainSections, params_with("prefix_lm", "lm", lm={"noise_density": 1.0}))
    with pytest.raises(StageError, match=r"objectives\.span\.noise_density=0\.0"):
        parse(PretrainSections, params_with("encoder_decoder", "span", span={"noise_density": 0.0}))
    with pytest.raises(StageError, match=r"objectives\.mlm\.masking_rate: unknown key"):
        parse(PretrainSections, params_with("encoder", "mlm", mlm={"masking_rate": 0.1}))


TOY = '''
    """A toy objective (its declaration and implementation) and architecture, registered from a module
    of their own."""

    from dataclasses import dataclass, field

    from models.architectures.base import implemented
    from models.architectures.decoder import Decoder
    from models.objectives.base import ObjectiveImplementation
    from models.pair import Pair
    from models.specs.architectures import register as register_architecture
    from models.specs.architectures.decoder import DecoderSpec
    from models.specs.objectives import register as register_objective
    from models.specs.objectives.base import ObjectiveParams, ObjectiveSpec


    @dataclass(frozen=True)
    class ReverseParams(ObjectiveParams):
        keep: int = field(default=4, metadata={"ge": 1})


    class Reverse(ObjectiveSpec):
        """Predict the first `keep` tokens of a row reversed, from the row."""

        name, kind, Params = "toy_reverse", "sequence", ReverseParams
        implementation = "toy_plugin"

        def widths(self, seq_len, params):
            return seq_len, params.keep, params.keep


    class ReversedPairs(ObjectiveImplementation):
        def pair(self, rows, params, generator, vocab_size, pieces):
            return Pair(rows, rows[:, : params.keep].flip(1))


    class WideDecoderSpec(DecoderSpec):
        """A decoder-only LM that pools the mean of its states."""

        name = "toy_decoder"
        poolings = ("mean",)
        implementation = "toy_plugin"


    class WideDecoder(WideDecoderSpec, Decoder):
        def pooled(self, model, ids, pad_mask, pooling):
            states = model.decode(ids, pad_mask)
            return states.mean(1)


    IMPLEMENTATION = ReversedPairs()
    register_objective(Reverse())
    register_architecture(WideDecoderSpec())
    implemented(WideDecoder())
'''


@pytest.fixture
def registries(tmp_path, monkeypatch):
    """The registries as they are, restored after the test (in place: modules hold them by reference)."""
    import sys

    from models.architectures.base import IMPLEMENTED

    registries = ARCHITECTURES, IMPLEMENTED, OBJECTIVES
    saved = [dict(registry) for registry in registries]
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("toy_plugin", None)
    for registry, entries in zip(registries, saved, strict=True):
        registry.clear()
        registry.update(entries)


def test_a_toy_objective_and_architecture_train_from_a_module_of_their_own(registries) -> None:
    import importlib

    from lmpipe.params.pretrain import objectives_params

    (registries / "toy_plugin.py").write_text(textwrap.dedent(TOY))
    importlib.import_module("toy_plugin")
    params = parse(
        PretrainSections,
        {
            "models": {"toy": {"arch": "toy_decoder", "objective": "toy_reverse"}},
            "objectives": {"toy_reverse": {"keep": 3}},
            "pretrain": {"seq_len": 16, "batch_size": 4},
        },
    )
    variant = params.models["toy"]
    train = train_config(variant.arch, variant.objective, params.pretrain, params.objectives, 1)
    assert train.objective_params.keep == 3 and objectives_params().toy_reverse.keep == 4
    model = variant.config(VOCAB)
    batch = make_batch(rows(4, 16), train, batch_generator(1, 0), VOCAB)
    assert batch["labels"].numel() == 4 * 3
    assert_learns(model, train, batch)


def test_shared_encoder_decoder_has_one_stack_at_the_cost_of_two() -> None:
    from lmpipe.params.pretrain import PretrainParams, objectives_params

    sizes = {"vocab_size": VOCAB, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}
    two = ModelConfig(arch="encoder_decoder", **sizes)
    shared = two.with_(share_encoder_decoder=True)
    decoder_only = ModelConfig(arch="decoder", **sizes)
    cross = 2 * (4 * 32 * 32 + 4 * 32 + 2 * 32)  # per layer: q, kv, out and their biases; its norm
    assert Transformer(shared).num_parameters() == Transformer(decoder_only).num_parameters() + cross
    assert Transformer(shared).num_parameters() < Transformer(two).num_parameters()
    train = train_config(
        "encoder_decoder", "span", PretrainParams(seq_len=24, batch_size=4), objectives_params(), 0
    )
    assert (
        count_step_flops(shared, train) == count_step_flops(two, train) == estimate_step_flops(shared, train)
    )
    torch.manual_seed(0)
    model = Transformer(shared).eval()
    ids = rows(1, 6)
    encoded = model.encode(ids)
    later = ids.clone()
    later[0, 5] = SPECIAL.n_special
    assert (model.encode(later) - encoded)[0, 0].abs().max() > 1e-6  # the encoding is bidirectional
    with pytest.raises(ValueError, match="encoder-decoder only"):
        decoder_only.with_(share_encoder_decoder=True)
    with pytest.raises(ValueError, match="n_decoder_layers must equal n_layers"):
        two.with_(share_encoder_decoder=True, n_decoder_layers=1)


def test_validating_params_imports_no_torch() -> None:
    """Every stage validates the whole of params.yaml, the pairs of `models` through the registries:
    the data stages must not pay torch's import (1.5 s and 100 MB) for it."""
    import subprocess
    import sys

    from tests.workdir import ROOT

    check = (
        "import sys; from lmpipe.params.project import load_params; "
        "params = load_params(); assert params.models, 'no models validated'; "
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
