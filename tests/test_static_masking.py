"""RoBERTa's static vs dynamic masking: with `objectives.mlm.masking: static` a row's masks are drawn
once per copy of the data (BERT's `dupe_factor`) and reused whenever that copy is read, whichever batch
the row lands in; `dynamic` (the default) draws fresh masks for every batch, as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmpipe.params.pretrain import PretrainParams, PretrainSections, objectives_params
from lmpipe.params.schema import parse
from lmpipe.pretraining import train_config
from lmpipe.runtime import StageError
from models.config import ModelConfig
from models.pair import Pair, stacked_pairs
from models.pretraining import PackedBatches
from models.special import SPECIAL
from tests.test_pairs import assert_learns

ROWS, SEQ_LEN, BATCH = 16, 8, 4  # 4 steps an epoch


def masks_by_row(tmp_path: Path, masking: str, copies: int, epochs: int) -> dict[tuple[int, int], tuple]:
    """(row, epoch) -> the row's masked inputs, over `epochs` epochs of the packed rows."""
    tokens = np.arange(107, 107 + ROWS * SEQ_LEN, dtype=np.uint16)  # row r starts at 107 + 8r
    tokens.tofile(tmp_path / "train.bin")
    run = PretrainParams(seq_len=SEQ_LEN, batch_size=BATCH, sampling="epoch")
    # half the tokens selected: which ones, a row's masks, shows in its inputs below
    mlm = {
        "mask_rate": 0.5,
        "mask_fraction": 0.5,
        "random_fraction": 0.5,
        "masking": masking,
        "copies": copies,
    }
    cfg = train_config("encoder", "mlm", run, objectives_params({"mlm": mlm}), seed=5)
    steps = epochs * ROWS // BATCH
    seen = {}
    for step, batch in enumerate(PackedBatches(tmp_path / "train.bin", "uint16", cfg, 2000, 0, steps)):
        rows = batch["input_ids"].clone()
        flat = rows.reshape(-1)
        flat[batch["positions"]] = -batch["labels"]  # a masked position shows its original, negated
        for j, row in enumerate(rows):
            original = torch.where(row < 0, -row, row)
            seen[(int(original[0] - 107) // SEQ_LEN, (step * BATCH + j) // ROWS)] = tuple(row.tolist())
    return seen


def test_static_masks_repeat_with_their_copy_and_dynamic_ones_do_not(tmp_path: Path) -> None:
    static = masks_by_row(tmp_path, "static", copies=2, epochs=4)
    assert len(static) == ROWS * 4
    for row in range(ROWS):
        # epochs 0 and 2 read copy 0, epochs 1 and 3 copy 1: the same masks, though in other batches
        assert static[(row, 0)] == static[(row, 2)] and static[(row, 1)] == static[(row, 3)]
    assert sum(static[(row, 0)] != static[(row, 1)] for row in range(ROWS)) >= ROWS - 1
    dynamic = masks_by_row(tmp_path, "dynamic", copies=2, epochs=4)
    assert sum(dynamic[(row, 0)] == dynamic[(row, 2)] for row in range(ROWS)) <= 1
    one_copy = masks_by_row(tmp_path, "static", copies=1, epochs=2)
    assert all(one_copy[(row, 0)] == one_copy[(row, 1)] for row in range(ROWS))


def test_static_masking_trains(tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(107, 300, ROWS * SEQ_LEN, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    run = PretrainParams(seq_len=SEQ_LEN, batch_size=BATCH, sampling="epoch", warmup_steps=0)
    cfg = train_config("encoder", "mlm", run, objectives_params({"mlm": {"masking": "static"}}), seed=1)
    model = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=SEQ_LEN)
    (batch,) = PackedBatches(tmp_path / "train.bin", "uint16", cfg, 300, 0, 1)
    assert_learns(model.with_(arch="encoder"), cfg, batch)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"objectives": {"mlm": {"masking": "static"}}},
            "objectives.mlm.masking: static masking fixes the masks of each row of the data, which needs "
            "pretrain.sampling: epoch (fixed rows), not random (models.m)",
        ),
        ({"objectives": {"mlm": {"masking": "static", "copies": 0}}}, "objectives.mlm.copies"),
        ({"objectives": {"mlm": {"masking": "fixed"}}}, "objectives.mlm.masking"),
    ],
)
def test_bad_static_masking_is_one_line(sections: dict, message: str) -> None:
    models = {"models": {"m": {"arch": "encoder", "objective": "mlm", "preset": "tiny"}}}
    with pytest.raises(StageError) as error:
        parse(PretrainSections, {**models, **sections})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_static_masking_on_epochs_of_fixed_rows_is_valid() -> None:
    sections = {
        "models": {
            "m": {"arch": "encoder", "objective": "mlm", "preset": "tiny", "pretrain": {"sampling": "epoch"}}
        },
        "objectives": {"mlm": {"masking": "static", "copies": 10}},
    }
    assert parse(PretrainSections, sections).objectives.mlm.copies == 10


def test_pairs_of_one_row_stack_into_a_padded_batch() -> None:
    one = Pair(torch.tensor([[5, 6, 7]]), torch.tensor([[8, 9]]), noise=torch.tensor([[True, False, True]]))
    short = Pair(
        torch.tensor([[5, 6, 0]]),
        torch.tensor([[8, 9]]),
        input_lengths=torch.tensor([2]),
        noise=torch.tensor([[False, True, False]]),
    )
    batch = stacked_pairs([one, short])
    assert batch.inputs.tolist() == [[5, 6, 7], [5, 6, SPECIAL.pad]] and batch.input_lengths.tolist() == [
        3,
        2,
    ]
    assert batch.noise.tolist() == [[True, False, True], [False, True, False]]
    assert batch.targets.tolist() == [[8, 9], [8, 9]] and batch.target_lengths is None
    same = stacked_pairs([one, one])
    assert same.input_lengths is None and same.inputs.tolist() == [[5, 6, 7], [5, 6, 7]]
