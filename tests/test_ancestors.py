"""The recurrent and feed-forward ancestors the seeds' summary table starts from: Dai & Le's LSTM LM
(`lstm`) reads left to right only, or right to left as ELMo's backward LM, its padding never reaching
a real position; word2vec's CBOW (`cbow`) predicts each token from the mean of its window alone;
ELMo's biLM (`elmo`) trains both LMs on every row and gives a task the scalar mix of its layers, which
a frozen backbone still trains; each trains, counts its FLOPs as estimated, exports as remote code, and
refuses what it cannot take in one line naming the key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from models.architectures.lstm import LSTMStack
from models.config import ModelConfig
from models.flops import count_step_flops, estimate_step_flops
from models.objectives.base import batch_generator
from models.pretraining import make_batch
from models.special import SPECIAL
from models.transformer import Transformer
from tests.test_pairs import assert_learns
from tests.test_params import assert_params_error
from tests.workdir import Workdir

SIZE = dict(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64, positions="none")
LSTM = ModelConfig(arch="lstm", **SIZE)
CBOW = ModelConfig(arch="cbow", window=2, **SIZE)
ELMO = ModelConfig(arch="elmo", **SIZE)


def ids_of(rows: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        SPECIAL.n_special, 300, (rows, length), generator=torch.Generator().manual_seed(seed)
    )


def changed_at(ids: torch.Tensor, column: int) -> torch.Tensor:
    other = ids.clone()
    other[:, column] = SPECIAL.n_special + (other[:, column] + 1 - SPECIAL.n_special) % 150
    return other


@pytest.mark.parametrize("reverse", [False, True])
def test_an_lstm_reads_one_way_and_its_padding_reaches_no_real_position(reverse: bool) -> None:
    """Left to right, a change at position 5 moves the states from 5 on only; right to left (ELMo's
    backward LM), up to 5 only. A row padded after 8 tokens has the states of those 8 alone."""
    torch.manual_seed(0)
    stack = LSTMStack(LSTM.with_(n_layers=3), reverse=reverse).eval()
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        base = stack(x, None)
        other = x.clone()
        other[:, 5] += 1.0
        moved = (stack(other, None) - base).abs().amax((0, 2)) > 1e-6
        assert moved.tolist() == [(i <= 5) if reverse else (i >= 5) for i in range(12)]
        pad = torch.ones(2, 12, dtype=torch.bool)
        pad[1, 8:] = False
        padded = stack(x, pad)
        alone = stack(x[1:, :8], None)
        torch.testing.assert_close(padded[1, :8], alone[0], atol=1e-6, rtol=0)
        assert len(stack.layer_states(x)) == 3


def test_cbows_state_is_the_mean_of_its_window_without_itself() -> None:
    """Each position's state: the mean of the embeddings of the real tokens within 2 of it, its own
    left out; its own token changes nothing at its position."""
    model = Transformer(CBOW).eval()
    ids = ids_of(2, 9)
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, 6:] = False
    with torch.no_grad():
        states = model.encode(ids, pad)
        embedded = model.embed(ids)
        for row, i in ((0, 0), (0, 4), (0, 8), (1, 5), (1, 3)):
            window = [j for j in range(max(0, i - 2), min(9, i + 3)) if j != i and pad[row, j]]
            torch.testing.assert_close(states[row, i], embedded[row, window].mean(0), atol=1e-6, rtol=0)
        moved = (model.encode(changed_at(ids, 4), pad) - states).abs().amax((0, 2)) > 1e-6
    assert moved.tolist() == [i in (2, 3, 5, 6) for i in range(9)]


def test_the_cbow_objective_predicts_every_token_from_its_window() -> None:
    sections = objectives_params()
    train = train_config("cbow", "cbow", PretrainParams(seq_len=16, batch_size=4), sections, 3)
    rows = ids_of(4, 16)
    rows[0, 3] = SPECIAL.eos
    batch = make_batch(rows, train, batch_generator(3, 0), 300)
    assert torch.equal(batch["input_ids"], rows)  # nothing replaced
    assert len(batch["labels"]) == 4 * 16 - 1  # every token but the special
    assert_learns(CBOW, train, batch)


def test_the_lstm_lm_learns_as_a_causal_lm() -> None:
    train = train_config("lstm", "clm", PretrainParams(seq_len=16, batch_size=4), objectives_params(), 3)
    rows = ids_of(4, train.row_length())
    assert_learns(LSTM, train, make_batch(rows, train, batch_generator(3, 0), 300))


@pytest.mark.parametrize(
    ("arch", "objective", "changes"),
    [
        ("lstm", "clm", {}),
        ("lstm", "clm", {"d_ff": 32, "n_layers": 1}),  # Dai & Le's: one layer, no projection
        ("lstm", "lm", {"n_layers": 3, "embedding_size": 16}),
        ("cbow", "cbow", {}),
        ("cbow", "cbow", {"lm_head": "transform"}),
        ("cbow", "cbow", {"lm_head": "untied"}),  # word2vec's output vectors
        ("elmo", "clm", {}),
        ("elmo", "clm", {"d_ff": 32, "n_layers": 1, "lm_head": "untied"}),
    ],
)
def test_the_flops_count_equals_the_estimate(arch: str, objective: str, changes: dict) -> None:
    model = ModelConfig(**{**SIZE, "arch": arch, **changes})
    train = train_config(arch, objective, PretrainParams(seq_len=16, batch_size=4), objectives_params(), 3)
    assert count_step_flops(model, train) == estimate_step_flops(model, train) > 0


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"models": {"decoder_clm": {"arch": "lstm"}}},
            "models.decoder_clm.positions: arch lstm takes none, not learned",
        ),
        (
            {"models": {"encoder_mlm": {"objective": "cbow"}}},
            "models.encoder_mlm.arch: objective cbow needs arch cbow, not encoder",
        ),
        ({"models": {"encoder_mlm": {"arch": "cbow", "positions": "none", "window": 0}}}, "window"),
        (
            {"models": {"decoder_clm": {"arch": "lstm", "positions": "none", "d_ff": 64}}},
            "models.decoder_clm.d_ff: arch lstm's 64 cells a layer are projected to d_model (128)",
        ),
        (
            {"models": {"encoder_mlm": {"lm_head": "untied", "embedding_size": 64}}},
            "models.encoder_mlm.lm_head: untied has output vectors of d_model",
        ),
    ],
)
def test_bad_ancestor_params_are_one_line_naming_the_key(changes: dict, expected: str) -> None:
    assert_params_error(changes, expected)


def test_the_stage_trains_both_and_exports_them_as_remote_code(sample_pipeline: Workdir) -> None:
    """pretrain@<model> and export@<model>: transformers loads each with trust_remote_code and computes
    what ours does."""
    import contextlib

    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    from models.transformer import load_pretrained
    from tests.pipeline_helpers import run_stages, stage_main

    settings = {
        "models": {
            "lstm": {"arch": "lstm", "objective": "clm", "preset": "tiny", "positions": "none"},
            "cbow": {
                "arch": "cbow",
                "objective": "cbow",
                "preset": "tiny",
                "positions": "none",
                "lm_head": "untied",
            },
            "elmo": {"arch": "elmo", "objective": "clm", "preset": "tiny", "positions": "none"},
        },
        "pretrain.max_steps": 4,
        "pretrain.warmup_steps": 0,
        "pretrain.val_every": 4,
        "pretrain.checkpoint_every": 4,
    }
    path = sample_pipeline.path
    with sample_pipeline.changed(settings), contextlib.chdir(path):
        for name in ("lstm", "cbow", "elmo"):
            run_stages(sample_pipeline, "pretrain", name)
            stage_main("export")([name])
    ids = torch.randint(SPECIAL.n_special, 1000, (2, 10))
    for name, auto in (("lstm", AutoModelForCausalLM), ("cbow", AutoModel), ("elmo", AutoModel)):
        metrics = json.loads((path / f"metrics/pretrain/{name}.json").read_text())
        assert metrics["steps"] == 4 and np.isfinite(metrics["val_loss"])
        model, _ = load_pretrained(path / f"checkpoints/{name}/final")
        theirs = auto.from_pretrained(path / f"checkpoints/{name}/hf", trust_remote_code=True).eval()
        with torch.no_grad():
            if name == "lstm":
                torch.testing.assert_close(theirs(input_ids=ids).logits, model.lm_logits(model.decode(ids)))
            else:
                torch.testing.assert_close(theirs(input_ids=ids).last_hidden_state, model.encode(ids))
    cbow, _ = load_pretrained(path / "checkpoints/cbow/final")
    masked_lm = AutoModelForMaskedLM.from_pretrained(path / "checkpoints/cbow/hf", trust_remote_code=True)
    with torch.no_grad():  # its own output vectors, not the word embeddings
        torch.testing.assert_close(masked_lm(input_ids=ids).logits, cbow.lm_logits(cbow.encode(ids)))
    elmo = json.loads((path / "checkpoints/elmo/hf/config.json").read_text())
    assert "AutoModelForCausalLM" not in elmo["auto_map"]  # its two LMs are no transformers LM class


def test_elmo_trains_both_lms_on_every_row() -> None:
    """The forward LM predicts each next token from those before it, the backward LM each previous one
    from those after it: the loss is their mean over the row's 2 (T - 1) predictions."""
    import torch.nn.functional as F

    train = train_config("elmo", "clm", PretrainParams(seq_len=16, batch_size=4), objectives_params(), 3)
    rows = ids_of(4, train.row_length())
    batch = make_batch(rows, train, batch_generator(3, 0), 300)
    assert torch.equal(batch["input_ids"], rows[:, :-1]) and torch.equal(batch["labels"], rows[:, 1:])
    torch.manual_seed(0)
    model = Transformer(ELMO).eval()
    with torch.no_grad():
        logits, labels = model.arch.logits_and_labels(model, batch)
        forward = model.lm_logits(model.encoder.forward_lm(model.embed_ids(rows[:, :-1]), None))
        backward_states = model.encoder.backward_lm(model.embed_ids(rows[:, 1:]), None)
        moved = backward_states - model.encoder.backward_lm(model.embed_ids(changed_at(rows[:, 1:], 8)), None)
    assert ((moved.abs().amax((0, 2)) > 1e-6).tolist()) == [i <= 8 for i in range(16)]  # right to left
    assert len(labels) == 2 * 4 * 16
    backward = model.lm_logits(backward_states)
    want = F.cross_entropy(forward.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
    want += F.cross_entropy(backward.flatten(0, 1), rows[:, :-1].flatten(), reduction="sum")
    torch.testing.assert_close(F.cross_entropy(logits, labels), want / len(labels))
    assert_learns(ELMO, train, batch)


def test_elmos_features_are_the_scalar_mix_of_its_layers_and_a_frozen_backbone_trains_only_it() -> None:
    """ELMo's eq. 1: γ Σ softmax(s)_j h_j over the embeddings (twice) and each layer's two directions,
    2·d wide; frozen, the head and the mix train and every other weight stays."""
    from models.heads import SequenceHead

    torch.manual_seed(0)
    model = Transformer(ELMO).eval()
    ids, pad = ids_of(2, 9), torch.ones(2, 9, dtype=torch.bool)
    pad[1, 6:] = False
    with torch.no_grad():
        model.encoder.mix.weights.copy_(torch.tensor([0.5, -1.0, 2.0]))
        model.encoder.mix.gamma.fill_(0.7)
        layers = model.encoder.layers(model.embed_ids(ids), pad)
        weights = torch.tensor([0.5, -1.0, 2.0]).softmax(0)
        want = 0.7 * sum(w * layer for w, layer in zip(weights, layers, strict=True))
        torch.testing.assert_close(model.encode(ids, pad), want)
    assert [layer.shape[-1] for layer in layers] == [64, 64, 64]
    head = SequenceHead(Transformer(ELMO), 2, frozen=True)
    before = {name: p.detach().clone() for name, p in head.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = head.loss(head(ids, pad), torch.tensor([0, 1]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    changed = {name for name, p in head.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {"backbone.encoder.mix.weights", "backbone.encoder.mix.gamma", "out.weight", "out.bias"}
