"""The fine-tuning loop: batch order, schedule, learning, determinism, predictions in input order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmpipe.finetuning import finetune_config
from lmpipe.params.finetune import FinetuneCommonParams, FinetuneTaskParams
from models.config import ModelConfig
from models.finetune_data import encode_pair, pad_batch
from models.finetuning import FinetuneConfig, epoch_batches, finetune, predict, warmup_linear
from models.heads import SequenceHead
from models.training import NonFiniteLoss, resolve_precision
from models.transformer import Transformer

CFG = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32)


def recipe(seed: int = 1, precision: str = "32-true", **task: float) -> FinetuneConfig:
    """The fine-tuning config of params.yaml's defaults with these task settings."""
    return finetune_config(FinetuneTaskParams(**task), FinetuneCommonParams(precision=precision), seed)


def head(arch: str, num_labels: int, seed: int = 0, **changes) -> SequenceHead:
    torch.manual_seed(seed)
    return SequenceHead(Transformer(CFG.with_(arch=arch, **changes)), num_labels, dropout=0.1)


def keyword_task(n: int, seed: int) -> tuple[list[list[int]], np.ndarray]:
    """Label 1 iff token 150 occurs somewhere in a random sentence of 3..20 tokens."""
    rng = np.random.default_rng(seed)
    ids, labels = [], []
    for _ in range(n):
        words = rng.integers(160, 300, rng.integers(3, 21)).tolist()
        label = int(rng.integers(2))
        if label:
            words[rng.integers(len(words))] = 150
        ids.append(encode_pair(words, None, CFG.max_len))
        labels.append(label)
    return ids, np.array(labels)


def test_epoch_batches_are_a_seeded_partition_that_groups_lengths() -> None:
    lengths = np.random.default_rng(0).integers(5, 120, 1000)
    plain = epoch_batches(lengths, seed=1, epoch=0, batch_size=16, group_by_length=False)
    grouped = epoch_batches(lengths, seed=1, epoch=0, batch_size=16, group_by_length=True)
    for batches in (plain, grouped):
        assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
        assert sorted(map(len, batches)) == [8] + [16] * 62  # one short batch, wherever it lands
    again = epoch_batches(lengths, 1, 0, 16, True)
    assert all(np.array_equal(a, b) for a, b in zip(grouped, again, strict=True))
    for other in (epoch_batches(lengths, 1, 1, 16, True), epoch_batches(lengths, 2, 0, 16, True)):
        assert not np.array_equal(np.concatenate(grouped), np.concatenate(other))

    def padded_tokens(batches: list[np.ndarray]) -> int:
        return sum(len(b) * lengths[b].max() for b in batches)

    assert padded_tokens(grouped) < 1.1 * lengths.sum() < 0.7 * padded_tokens(plain)
    longest = [lengths[b].max() for b in grouped]
    assert longest != sorted(longest, reverse=True)  # the long batches do not all come first


def test_warmup_then_linear_decay() -> None:
    factors = [warmup_linear(step, warmup=4, total=20) for step in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0 and factors[-1] == pytest.approx(1 / 16)
    assert all(a >= b for a, b in zip(factors[3:], factors[4:], strict=False))


@pytest.mark.parametrize(
    ("arch", "changes"),
    [
        ("encoder", {}),
        ("decoder", {}),
        ("encoder_decoder", {}),
        ("encoder", {"embedding_size": 16, "share_layers": "all"}),  # ALBERT's
    ],
    ids=["encoder", "decoder", "encoder_decoder", "albert"],
)
def test_every_architecture_learns_a_keyword_task(arch: str, changes: dict) -> None:
    train_ids, train_labels = keyword_task(512, seed=0)
    dev_ids, dev_labels = keyword_task(200, seed=1)
    model = head(arch, 2, **changes)
    cfg = recipe(lr=3e-3, epochs=4, batch_size=32, warmup_ratio=0.1, seed=3)
    losses = finetune(model, train_ids, train_labels, cfg)
    assert len(losses) == cfg.total_steps(512) == 64
    predictions, loss = predict(model, dev_ids, dev_labels, batch_size=64, precision="32-true")
    assert predictions.dtype == np.int64 and predictions.shape == (200,)
    accuracy = float((predictions == dev_labels).mean())
    assert accuracy > 0.9, accuracy
    assert loss < 0.4 and np.mean(losses[-8:]) < np.mean(losses[:8])


def test_the_auxiliary_lm_loss_trains_the_task_and_the_lm_together() -> None:
    """GPT-1's L2 + 0.5·L1 on a decoder: the task is learnt and the input's LM loss falls."""
    train_ids, train_labels = keyword_task(512, seed=0)
    dev_ids, dev_labels = keyword_task(200, seed=1)
    torch.manual_seed(0)
    model = SequenceHead(Transformer(CFG.with_(arch="decoder")), 2, dropout=0.1, lm_loss_weight=0.5)
    ids, mask = pad_batch(dev_ids)

    def lm_loss() -> float:
        with torch.no_grad():
            return float(model.eval().forward_and_lm_loss(ids, mask)[1])

    before = lm_loss()
    losses = finetune(model, train_ids, train_labels, recipe(lr=3e-3, epochs=4, batch_size=32, seed=3))
    predictions, _ = predict(model, dev_ids, dev_labels, batch_size=64, precision="32-true")
    assert float((predictions == dev_labels).mean()) > 0.9
    # the words are uniform over 140 ids: an LM that learnt that much is at ln 140 = 4.94 or below
    assert before > 5.5 and lm_loss() < 5.0 and np.mean(losses[-8:]) < np.mean(losses[:8])


def test_same_seed_same_model_bit_for_bit() -> None:
    ids, labels = keyword_task(96, seed=0)
    cfg = recipe(lr=1e-3, epochs=2, batch_size=16, seed=7)
    runs = []
    for _ in range(2):
        model = head("encoder", 2)
        losses = finetune(model, ids, labels, cfg)
        runs.append((losses, model.state_dict()))
    assert runs[0][0] == runs[1][0]
    for key, value in runs[0][1].items():
        assert torch.equal(value, runs[1][1][key]), key
    other = head("encoder", 2)
    assert finetune(other, ids, labels, recipe(lr=1e-3, epochs=2, batch_size=16, seed=8)) != runs[0][0]


def test_predictions_come_back_in_input_order() -> None:
    ids, labels = keyword_task(150, seed=4)
    model = head("decoder", 1)
    scores, loss = predict(model, ids, labels.astype(np.float64), batch_size=32, precision="32-true")
    one_by_one = [
        predict(model, [row], labels[i : i + 1].astype(np.float64), 1, "32-true")[0][0]
        for i, row in enumerate(ids)
    ]
    assert scores.shape == (150,) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, one_by_one, atol=1e-5)
    assert loss == pytest.approx(float(np.mean((scores - labels) ** 2)), rel=1e-5)


def test_regression_trains_on_float_labels_and_bf16_runs_on_the_cpu() -> None:
    ids, labels = keyword_task(64, seed=5)
    targets = labels * 4.0 + 0.5  # STS-B-like scores in [0, 5]
    model = head("encoder_decoder", 1)
    losses = finetune(model, ids, targets, recipe(lr=1e-3, epochs=1, batch_size=16, precision="bf16-mixed"))
    assert len(losses) == 4 and all(np.isfinite(losses))
    predictions, _ = predict(model, ids, targets, 16, "bf16-mixed")
    assert predictions.shape == (64,) and np.isfinite(predictions).all()


def test_a_diverging_loss_stops_with_the_step() -> None:
    ids, labels = keyword_task(64, seed=6)
    targets = np.full(64, 1e30)  # squared error overflows float32
    with pytest.raises(NonFiniteLoss, match="loss became inf at step 0"):
        finetune(head("encoder", 1), ids, targets, recipe(epochs=1, batch_size=16))


def test_the_losses_are_read_from_the_device_every_n_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host reads the losses in one transfer per READ_LOSSES_EVERY steps, not one per step; what it
    reads is what a per-step read gave, and a loss that overflows is reported with its own step."""
    import models.finetuning as fine

    reads = []

    def counted(pending: list[torch.Tensor], steps: range) -> list[float]:
        reads.append((steps.start, len(pending)))
        return read(pending, steps)

    read = fine.read_losses
    monkeypatch.setattr(fine, "READ_LOSSES_EVERY", 3)
    monkeypatch.setattr(fine, "read_losses", counted)
    ids, labels = keyword_task(112, seed=6)
    losses = finetune(head("encoder", 2), ids, labels, recipe(epochs=1, batch_size=16))  # 7 steps
    assert reads == [(0, 3), (3, 3), (6, 1)] and len(losses) == 7
    monkeypatch.setattr(fine, "READ_LOSSES_EVERY", 1)  # a read per step, as before
    assert finetune(head("encoder", 2), ids, labels, recipe(epochs=1, batch_size=16)) == losses

    cfg = recipe(epochs=1, batch_size=16)
    lengths = np.array([len(row) for row in ids])
    fifth = fine.epoch_batches(lengths, cfg.seed, 0, cfg.batch_size, cfg.group_by_length)[4]
    targets = np.full(112, 0.5)
    targets[fifth] = 1e30  # the squared error of step 4's rows overflows float32
    for every in (1, 50):
        monkeypatch.setattr(fine, "READ_LOSSES_EVERY", every)
        with pytest.raises(NonFiniteLoss, match="^the loss became inf at step 4$"):
            finetune(head("encoder", 1), ids, targets, cfg)


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "resolved"),
    [(False, False, "32-true"), (True, False, "bf16-mixed"), (False, True, "bf16-mixed")],
)
def test_auto_precision_is_bf16_only_where_the_cpu_has_it_natively(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool, resolved: str
) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == resolved
    for given in ("32-true", "bf16-mixed"):  # a precision named is kept, wherever it runs
        assert resolve_precision(given, cpu) == given
