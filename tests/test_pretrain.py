"""pretrain@{model}: learning on real text, exact resume after SIGKILL (of a temporary DVC experiment,
resumed by `dvc repro`), the exported model, and the failures a user can cause."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.pretraining import train_config
from lmpipe.tracking import find_run
from models.transformer import load_pretrained
from tests.pipeline_helpers import run_stages
from tests.project import command_env, copy_project, sh
from tests.workdir import DEFAULT_PARAMS, ROOT, Workdir

MODELS = {
    "encoder_mlm": {"arch": "encoder", "objective": "mlm", "preset": "tiny"},
    "decoder_clm": {"arch": "decoder", "objective": "clm", "preset": "tiny"},
    "encdec_span": {"arch": "encoder_decoder", "objective": "span", "preset": "tiny"},
}
TARGET = "pretrain@decoder_clm"  # not the fine-tunes downstream


@pytest.fixture
def decoder_only(sample_pipeline: Workdir) -> Iterator[Workdir]:
    """This test's sample project training only the tiny decoder."""
    with sample_pipeline.changed({"models": {"decoder_clm": MODELS["decoder_clm"]}}):
        yield sample_pipeline


@pytest.fixture
def encoder_only(sample_pipeline: Workdir) -> Iterator[Workdir]:
    """This test's sample project training only the tiny encoder."""
    with sample_pipeline.changed({"models": {"encoder_mlm": MODELS["encoder_mlm"]}}):
        yield sample_pipeline


def unigram_entropy(tokens: np.ndarray) -> float:
    counts = np.bincount(tokens).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_the_stage_learns_real_text(real_pipeline: Workdir) -> None:
    """The pretrain stage's loop (Lightning, its schedule and data) learns real text: the tiny decoder's
    100 steps of 16 (measured on the 8 MB corpus, 2-core AMD EPYC without AVX-512: 0.11 nats under the
    bar; 50 steps miss it by 0.15). Every objective learns in tests/test_objectives_learn.py."""
    name, steps, batch = "decoder_clm", 100, 16
    settings = {"models": {name: MODELS[name]}, "pretrain.max_steps": steps, "pretrain.batch_size": batch}
    with real_pipeline.changed(settings | {"pretrain.lr": 0.003, "pretrain.val_every": steps}):
        run_stages(real_pipeline, "pretrain", name)
    path = real_pipeline.path
    meta = json.loads((path / "data/tokens/meta.json").read_text())
    baseline = unigram_entropy(np.memmap(path / "data/tokens/train.bin", dtype=meta["dtype"], mode="r"))
    result = json.loads((path / f"metrics/pretrain/{name}.json").read_text())
    assert result["steps"] == steps
    # 0.3 nats: a quarter lower perplexity than the best context-free guess
    assert result["val_loss"] < baseline - 0.3, (result, baseline)


@pytest.mark.parametrize(
    ("model", "objectives"),
    [
        ({"arch": "encoder", "objective": "mlm"}, {"mlm": {"mask_unit": "span"}}),
        ({"arch": "encoder_decoder", "objective": "bart"}, {"bart": {"permute_sentences": 1.0}}),
    ],
)
def test_the_stage_gives_an_objective_the_piece_tables_it_reads(
    sample_pipeline: Workdir, model: dict, objectives: dict
) -> None:
    """Whole-word spans read the tokenizer's word starts, sentence permutation its sentence ends
    (models/pieces.py): the stage builds what the objective names from the trained tokenizer."""
    settings = {"models": {"m": model | {"preset": "tiny"}}, "pretrain.max_steps": 3}
    settings |= {
        f"objectives.{name}.{key}": value for name, keys in objectives.items() for key, value in keys.items()
    }
    with sample_pipeline.changed(
        settings | {"pretrain.val_every": 3, "pretrain.warmup_steps": 1, "pretrain.batch_size": 4}
    ):
        run_stages(sample_pipeline, "pretrain", "m")
        result = json.loads((sample_pipeline.path / "metrics/pretrain/m.json").read_text())
    assert result["steps"] == 3 and np.isfinite(result["val_loss"])


def decoder_project(template: Path, path: Path, pretrain: dict) -> Path:
    """A copy of the reproduced CI-sized project (its data up to date), with one tiny CLM model and
    `pretrain` settings."""

    def one_decoder(params: dict) -> None:
        params["models"] = {"decoder_clm": MODELS["decoder_clm"]}
        params["pretrain"].update(pretrain)

    return copy_project(template, path, one_decoder)


PRETRAIN_RUN = {"stage": "pretrain", "model": "decoder_clm"}  # the tags of pretrain@decoder_clm's runs


def logged_losses(tmp: Path) -> list[tuple[int, float]]:
    """train/loss of the project's one pretrain run, in its own store."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    run_id = find_run(DEFAULT_PARAMS["tracking"]["experiment"], PRETRAIN_RUN, uri)
    history = MlflowClient(uri).get_metric_history(run_id, "train/loss")
    return sorted((m.step, m.value) for m in history)


def resume_file(project: Path, name: str) -> Path | None:
    """A file of decoder_clm's unfinished run in `project`, if there is one."""
    return next(project.glob(f"checkpoints/decoder_clm/resume/*/{name}"), None)


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_sigkilled_run_resumes_to_identical_weights(reproduced_template: Path, tmp_path: Path) -> None:
    """Killed after step 15 in a temporary DVC experiment (a sweep point's or a profile's, whose copy of
    the workspace is gone with it), with its batches built by two DataLoader workers, and resumed there
    by `dvc repro`: the same weights, losses and curve as a run straight through that built them in the
    training process, and one MLflow run in the workspace's store. Step 15 is also a validation step:
    its checkpoint holds that validation, which the resumed run does not repeat."""
    settings = {"max_steps": 40, "checkpoint_every": 15, "val_every": 5, "log_every": 1, "warmup_steps": 5}
    straight = decoder_project(reproduced_template, tmp_path / "straight", settings | {"num_workers": 0})

    def two_loader_workers(params: dict) -> None:  # an odd step to resume at: worker 0 builds what 1 did
        params["pretrain"]["num_workers"] = 2

    killed = copy_project(straight, tmp_path / "killed", two_loader_workers)  # the same data, once
    sh(straight, "dvc", "repro", TARGET, MLFLOW_TRACKING_URI=None)
    assert resume_file(straight, "fingerprint") is None  # a finished run keeps no checkpoints

    process = subprocess.Popen(
        ["dvc", "exp", "run", "--temp", TARGET],
        cwd=killed,
        env=command_env(MLFLOW_TRACKING_URI=None),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while resume_file(killed, "step15.ckpt") is None and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint at step 15 in 300 s"
        time.sleep(0.01)
    time.sleep(0.2)  # let the checkpoint file be written completely
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert not (killed / "checkpoints/decoder_clm/final").exists()

    out = sh(killed, "dvc", "repro", TARGET, MLFLOW_TRACKING_URI=None)
    assert "Running stage 'pretrain@decoder_clm'" in out.stdout
    assert "resuming from" in out.stderr
    ours = load_file(killed / "checkpoints/decoder_clm/final/model.safetensors")
    reference = load_file(straight / "checkpoints/decoder_clm/final/model.safetensors")
    assert ours.keys() == reference.keys()
    for key in ours:
        assert torch.equal(ours[key], reference[key]), key
    # train/loss at step index 0..39: the killed experiment's steps and the resumed ones, in the
    # workspace's store (the steps after the checkpoint, logged again by the resumed run, agree)
    losses = dict(logged_losses(killed))
    assert losses == dict(logged_losses(straight)) and sorted(losses) == list(range(40))
    curve = plots(killed, "decoder_clm")
    assert curve == plots(straight, "decoder_clm")
    validated = [int(row["step"]) for row in csv.DictReader(curve) if row["val_loss"]]
    assert validated == list(range(5, 41, 5))
    result = json.loads((killed / "metrics/pretrain/decoder_clm.json").read_text())
    assert result["steps"] == 40
    assert resume_file(killed, "last.ckpt") is None  # deleted once the run has finished


def test_exported_model_loads_without_pickle(sample_pipeline: Workdir) -> None:
    # the model's own step budget (models.<name>.pretrain) wins over the section's
    own_budget = {**MODELS["encdec_span"], "pretrain": {"max_steps": 5}}
    budget = {"models": {"encdec_span": own_budget}, "pretrain.max_steps": 500}
    with sample_pipeline.changed({**budget, "pretrain.warmup_steps": 0}):
        run_stages(sample_pipeline, "pretrain", "encdec_span")
    final = sample_pipeline.path / "checkpoints/encdec_span/final"
    model, config = load_pretrained(final)
    tok = json.loads((sample_pipeline.path / "data/tokenizer/tokenizer.json").read_text())
    assert (
        config["tokenizer_sha256"] == tok["sha256"] and config["objective"] == "span" and config["steps"] == 5
    )
    assert config["synthetic"] is True
    stored = load_file(final / "model.safetensors")
    assert sum(t.numel() for t in stored.values()) == model.num_parameters()
    ids = torch.randint(107, tok["vocab_size"], (2, 16))
    assert model.eval()(ids, decoder_ids=ids[:, :4]).shape == (2, 4, model.cfg.d_model)


def test_bad_model_params_fail_early(workdir: Workdir) -> None:
    workdir.set("models", {"odd": {"arch": "decoder", "objective": "mlm"}})
    result = workdir.run("pack")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: params.yaml: models.odd.objective='mlm': does not fit arch 'decoder', whose converter "
        "takes sequence or targets_only pairs ('mlm' makes aligned ones; these fit: clm, lm, span, "
        "bert_style, drop, deshuffle, bart, mtp)"
    )
    workdir.set("models", {"long": {"arch": "decoder", "objective": "clm", "preset": "tiny"}})
    workdir.set("pretrain.seq_len", 256)
    result = workdir.run("pack")
    assert "models.long.max_len (128) is shorter than pretrain.seq_len (256)" in result.stderr
    workdir.set("pretrain.seq_len", 128)
    result = subprocess.run(
        [sys.executable, "-m", "stages.pretrain", "nope"],
        cwd=workdir.path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "error: params.yaml: models.nope: no such model; the models are: long"


def test_non_finite_loss_stops_with_one_line_and_keeps_the_checkpoint(decoder_only: Workdir) -> None:
    with decoder_only.changed(
        {
            "pretrain.max_steps": 50,
            "pretrain.lr": 1.0e6,
            "pretrain.warmup_steps": 0,
            "pretrain.grad_clip": 0,
            "pretrain.checkpoint_every": 1,
        }
    ):
        result = decoder_only.run("pretrain", "decoder_clm")
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: pretrain@decoder_clm: the loss became nan at step ") or last.startswith(
        "error: pretrain@decoder_clm: the loss became inf at step "
    ), last
    kept = re.search(
        r"the last good checkpoint in (checkpoints/decoder_clm/resume/[0-9a-f]{16}) is kept", last
    )
    assert kept, last
    assert "Traceback" not in result.stderr
    step = int(last.split(" at step ")[1].split(";")[0])
    saved = torch.load(decoder_only.path / kept[1] / "last.ckpt", weights_only=False)
    assert saved["global_step"] <= step
    assert all(math.isfinite(entry["train_loss"]) for entry in saved["loss_history"])


def pretrain_runs(name: str) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    experiment = client.get_experiment_by_name(DEFAULT_PARAMS["tracking"]["experiment"])
    filter_string = f"tags.stage = 'pretrain' and tags.model = '{name}'"
    return len(client.search_runs([experiment.experiment_id], filter_string)) if experiment else 0


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
@pytest.mark.parametrize("memory", [False, True], ids=["decoder", "transformer_xl"])
def test_two_ddp_processes_train_as_one_process_on_the_same_global_batch(
    decoder_only: Workdir, memory: bool
) -> None:
    """The GPU settings on the CPU: two DDP processes (gloo) with bf16 autocast, killed after the
    checkpoint at a validation step and resumed from it, train as one process accumulating their two
    micro-batches, the curve's validation points included; rank 0 alone writes the outputs and the one
    MLflow run. With Transformer-XL's memory, each process's lanes are the one process's micro-batches,
    in training and in validation, and the checkpoint holds both processes' memories."""
    path, runs = decoder_only.path, pretrain_runs("decoder_clm")
    # small batches: bf16 is emulated, and slow, on CPUs without AVX-512 BF16
    steps = {"pretrain.max_steps": 20, "pretrain.warmup_steps": 0, "pretrain.val_every": 10}
    steps |= {"pretrain.checkpoint_every": 5, "pretrain.precision": "bf16-mixed"}
    steps |= {"pretrain.batch_size": 4, "pretrain.seq_len": 32, "pretrain.val_batches": 2}
    if memory:  # in fp32: under bf16 the gradients of W_r, which projects the distances' sinusoids, are
        # near rounding, and Adam turns the two sums' rounding into 3 % of its norm (fp32: 1e-4)
        xl = {**MODELS["decoder_clm"], "positions": "xl", "mem_len": 32}
        steps |= {
            "models": {"decoder_clm": xl},
            "pretrain.sampling": "stream",
            "pretrain.precision": "32-true",
        }
    with decoder_only.changed(steps | {"pretrain.strategy": "ddp", "pretrain.devices": 2}):
        killed_after("step10.ckpt", decoder_only)
        assert not (path / "checkpoints/decoder_clm/final").exists(), "the run ended before it was killed"
        result = decoder_only.run("pretrain", "decoder_clm")
        micro_batch = micro_batch_flops(path, "decoder_clm")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stderr
    ddp = json.loads((path / "metrics/pretrain/decoder_clm.json").read_text())
    assert ddp["steps"] == 20 and ddp["tokens_seen"] == 20 * 4 * 32 * 2
    assert ddp["flops_per_step"] == 2 * micro_batch  # a step is both processes' micro-batches
    assert pretrain_runs("decoder_clm") == runs + 1  # the resumed run goes on in the killed one's
    model, config = load_pretrained(path / "checkpoints/decoder_clm/final")
    assert config["steps"] == 20 and model.cfg.mem_len == (32 if memory else 0)
    ddp_weights = load_file(path / "checkpoints/decoder_clm/final/model.safetensors")
    ddp_curve = plots(path, "decoder_clm")

    with decoder_only.changed(steps | {"pretrain.accumulate": 2}):
        run_stages(decoder_only, "pretrain", "decoder_clm")
    one = json.loads((path / "metrics/pretrain/decoder_clm.json").read_text())
    assert (one["tokens_seen"], one["flops_per_step"]) == (ddp["tokens_seen"], ddp["flops_per_step"])
    assert one["val_loss"] == pytest.approx(ddp["val_loss"], rel=1e-3)
    one_weights = load_file(path / "checkpoints/decoder_clm/final/model.safetensors")
    # the curve: a step's loss is the mean over its micro-batches, of both processes under DDP
    curves = [csv.DictReader(lines) for lines in (ddp_curve, plots(path, "decoder_clm"))]
    for ddp_row, one_row in zip(*curves, strict=True):
        assert ddp_row["step"] == one_row["step"]
        for key in ("train_loss", "val_loss"):
            assert float(ddp_row[key] or "nan") == pytest.approx(
                float(one_row[key] or "nan"), rel=1e-3, nan_ok=True
            )
    # the same updates up to the order of the gradients' sums, which Adam amplifies where a gradient is
    # pure rounding (the attention keys' bias), so the weights are compared as a whole
    assert one_weights.keys() == ddp_weights.keys()
    difference = torch.cat([(ddp_weights[key] - value).flatten() for key, value in one_weights.items()])
    norm = torch.cat([value.flatten() for value in one_weights.values()]).norm()
    assert difference.norm() / norm < 1e-3, float(difference.norm() / norm)


def plots(project: Path, name: str) -> list[str]:
    return (project / f"plots/pretrain/{name}.csv").read_text().splitlines()


def killed_after(checkpoint: str, workdir: Workdir) -> None:
    """`python -m stages.pretrain decoder_clm` and the processes it launched, SIGKILLed once its run has
    written `checkpoint`."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stages.pretrain", "decoder_clm"],
        cwd=workdir.path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while resume_file(workdir.path, checkpoint) is None and process.poll() is None:
        assert time.monotonic() < deadline, f"no {checkpoint} in 300 s"
        time.sleep(0.01)
    time.sleep(0.2)  # let the checkpoint file be written completely
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


def test_step_checkpoints_hold_their_validation_and_a_resumed_run_writes_only_later_ones(
    tmp_path: Path,
) -> None:
    """StepCheckpoint, two micro-batches a step, checkpoints every 2 steps, validation every 4: a
    checkpoint at a validation step holds that validation; a run resumed from either kind neither
    validates its step again nor writes its checkpoint again."""
    import lightning as L

    from models.pretraining import StepCheckpoint

    class Toy(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.validated: list[int] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.layer(batch).pow(2).mean()

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            pass

        def on_validation_epoch_end(self) -> None:
            self.validated.append(self.global_step)

        def on_save_checkpoint(self, checkpoint: dict) -> None:
            checkpoint["validated"] = list(self.validated)

        def on_load_checkpoint(self, checkpoint: dict) -> None:
            self.validated = checkpoint["validated"]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    folder = tmp_path / "checkpoints"

    def fit(resume: Path | None = None) -> Toy:
        torch.manual_seed(0)
        module, data = Toy(), torch.randn(64, 2)
        checkpoints = StepCheckpoint(
            val_every=4,
            dirpath=folder,
            filename="step{step}",
            auto_insert_metric_name=False,
            every_n_train_steps=2,
            save_top_k=-1,
        )
        trainer = L.Trainer(
            max_steps=12,
            accumulate_grad_batches=2,
            val_check_interval=4 * 2,
            check_val_every_n_epoch=None,
            num_sanity_val_steps=0,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[checkpoints],
        )
        trainer.fit(
            module, DataLoader(data, batch_size=2), DataLoader(data[:4], batch_size=2), ckpt_path=resume
        )
        return module

    def written() -> dict[int, list[int]]:
        """step -> the steps validated before its checkpoint was written"""
        found = [torch.load(path, weights_only=False) for path in folder.glob("*.ckpt")]
        return {checkpoint["global_step"]: checkpoint["validated"] for checkpoint in found}

    assert fit().validated == [4, 8, 12]
    assert written() == {step: [v for v in (4, 8, 12) if v <= step] for step in (2, 4, 6, 8, 10, 12)}
    for start in (2, 4):  # a step that does not validate, one that does
        kept = folder / f"step{start}.ckpt"
        for path in folder.glob("*.ckpt"):
            if path != kept:
                path.unlink()
        before = kept.read_bytes()
        assert fit(resume=kept).validated == [4, 8, 12]
        assert sorted(written()) == list(range(start, 13, 2)) and kept.read_bytes() == before


def test_a_run_holds_its_checkpoint_folder_alone_and_deletes_it_once_finished(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two sweep points that pretrain the same thing at once take turns; a failed run keeps its
    checkpoints for the next try, a finished one deletes them, other runs' folders are left alone."""
    from lmpipe.pretraining import resumable

    resume = tmp_path / "checkpoints/m/resume"
    other = resume / "0123456789abcdef"  # an interrupted run with other settings
    other.mkdir(parents=True)
    (other / "last.ckpt").write_bytes(b"x" * 1000)
    ours, fingerprint = resume / "fedcba9876543210", "fedcba9876543210" + "0" * 48

    with pytest.raises(RuntimeError), resumable(ours, fingerprint, is_rank_zero=True) as ckpt:
        assert ckpt is None
        (ours / "last.ckpt").write_bytes(b"step 5")
        raise RuntimeError("interrupted")
    assert (ours / "last.ckpt").exists()  # kept: the next try resumes from it

    turns: list[str] = []

    def second_point() -> None:
        with resumable(ours, fingerprint, is_rank_zero=True) as ckpt:
            turns.append(f"second resumes from {ckpt}")

    with caplog.at_level(logging.INFO, logger="lmpipe"):
        with resumable(ours, fingerprint, is_rank_zero=True) as ckpt:
            assert ckpt == ours / "last.ckpt"
            waiting = threading.Thread(target=second_point)
            waiting.start()
            time.sleep(0.5)
            turns.append("first finishes")
        waiting.join(timeout=30)
    assert turns == ["first finishes", "second resumes from None"]  # the first run's folder was deleted
    assert "another process is training the same run" in caplog.text
    assert "also holds 1 other runs' checkpoints" in caplog.text
    assert not ours.exists() and (other / "last.ckpt").exists()


@pytest.mark.parametrize("sampling", ["random", "epoch"])
def test_batches_are_a_function_of_the_step(tmp_path: Path, sampling: str) -> None:
    from models.pretraining import PackedBatches

    tokens = np.arange(107, 107 + 64 * 9, dtype=np.uint16)  # 64 rows of 9 tokens (CLM, seq_len 8)
    tokens.tofile(tmp_path / "train.bin")
    run = PretrainParams(seq_len=8, batch_size=4, sampling=sampling)
    cfg = train_config("decoder", "clm", run, objectives_params(), seed=5)
    whole = list(PackedBatches(tmp_path / "train.bin", "uint16", cfg, 2000, start=0, stop=32))
    resumed = list(PackedBatches(tmp_path / "train.bin", "uint16", cfg, 2000, start=20, stop=32))
    for a, b in zip(whole[20:], resumed, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
    # built by two DataLoader workers, resumed at an odd step: the same batches (the same random draws)
    resumed_by_workers = PackedBatches(tmp_path / "train.bin", "uint16", cfg, 2000, start=21, stop=32)
    loader = DataLoader(resumed_by_workers, batch_size=None, num_workers=2)
    for a, b in zip(whole[21:], loader, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    # two processes' micro-step m is one process's micro-steps 2m and 2m + 1: the same global batch
    path = tmp_path / "train.bin"
    ranks = [list(PackedBatches(path, "uint16", cfg, 2000, 0, 16, rank, world_size=2)) for rank in (0, 1)]
    for step, rank in itertools.product(range(16), (0, 1)):
        assert torch.equal(ranks[rank][step]["input_ids"], whole[2 * step + rank]["input_ids"])
    assert not torch.equal(ranks[0][0]["input_ids"], ranks[1][0]["input_ids"])
    if sampling == "epoch":  # 16 steps of 4 rows visit each of the 64 rows once per epoch
        firsts = [int(row[0]) for batch in whole[:16] for row in batch["input_ids"]]
        assert sorted(firsts) == [107 + 9 * r for r in range(64)]


def test_wall_clock_budget_stops_early_and_records_steps(decoder_only: Workdir) -> None:
    with decoder_only.changed(
        {"pretrain.max_steps": 100_000, "pretrain.max_minutes": 0.05, "pretrain.val_every": 10_000}
    ):
        run_stages(decoder_only, "pretrain", "decoder_clm")
    summary = json.loads((decoder_only.path / "metrics/pretrain/decoder_clm.json").read_text())
    assert summary["stopped_by"] == "max_minutes" and 0 < summary["steps"] < 100_000
    assert (
        json.loads((decoder_only.path / "checkpoints/decoder_clm/final/config.json").read_text())["steps"]
        == summary["steps"]
    )


def test_the_thread_count_is_the_params_not_the_caller_s(
    decoder_only: Workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flow running stages side by side gives each its share of the cores (OMP_NUM_THREADS, and so
    PyTorch's threads); training computes with `pretrain.threads` all the same: the thread count changes
    the float bits, and the same params must give the same weights."""
    weights, before = [], torch.get_num_threads()
    short = {"pretrain.threads": 2, "pretrain.max_steps": 6, "pretrain.warmup_steps": 2}
    try:
        for share in (1, 2):
            torch.set_num_threads(share)
            monkeypatch.setenv("OMP_NUM_THREADS", str(share))
            with decoder_only.changed(short | {"pretrain.val_every": 100}):
                run_stages(decoder_only, "pretrain", "decoder_clm")
            weights.append(
                (decoder_only.path / "checkpoints/decoder_clm/final/model.safetensors").read_bytes()
            )
    finally:
        torch.set_num_threads(before)
    assert weights[0] == weights[1]


def micro_batch_flops(project: Path, name: str) -> int:
    """FLOPs of one micro-batch of `name` as the project's params.yaml sets it up."""
    from lmpipe.params.project import load_params
    from models.flops import count_step_flops

    vocab = json.loads((project / "data/tokens/meta.json").read_text())["vocab_size"]
    params = load_params(project / "params.yaml")
    variant = params.models[name]
    train = train_config(
        variant.arch, variant.objective, params.pretrain_of(name), params.objectives, params.seed
    )
    return count_step_flops(variant.config(vocab), train)


def test_flops_budget_sets_the_steps_and_every_run_records_its_flops(decoder_only: Workdir) -> None:
    from mlflow.tracking import MlflowClient

    path = decoder_only.path
    step = micro_batch_flops(path, "decoder_clm")
    budget = {"pretrain.max_steps": 3, "pretrain.warmup_steps": 2, "pretrain.val_every": 100}
    with decoder_only.changed(budget | {"pretrain.max_flops": 7.5 * step}):  # max_steps gives way
        run_stages(decoder_only, "pretrain", "decoder_clm")
    summary = json.loads((path / "metrics/pretrain/decoder_clm.json").read_text())
    assert summary["steps"] == 7 and summary["stopped_by"] == "max_flops"
    assert summary["flops_per_step"] == step and summary["train_flops"] == 7 * step
    assert summary["train_flops_estimate"] == summary["train_flops"]  # 6·N·D + attention, to the FLOP
    run_id = find_run(DEFAULT_PARAMS["tracking"]["experiment"], PRETRAIN_RUN)
    logged = MlflowClient().get_run(run_id).data
    assert logged.metrics["final/train_flops"] == 7 * step
    assert logged.params["pretrain.max_steps"] == "7"  # the steps it trains, not the max_steps it ignores

    with decoder_only.changed(budget | {"pretrain.max_flops": 1.5 * step}):
        result = decoder_only.run("pretrain", "decoder_clm")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: params.yaml: pretrain.max_flops: {1.5 * step:.3g} FLOPs buys 1 steps of {step:.3g} "
        "FLOPs for decoder_clm, fewer than warmup_steps (2) or 1"
    )


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_torch_compile_switch(encoder_only: Workdir) -> None:
    """`pretrain.compile` runs the model and the loss through torch.compile (TorchDynamo holds compiled
    code for both), and without it nothing is compiled."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    from models.pretraining import token_loss
    from models.transformer import Transformer

    losses = []
    for compile_ in (False, True):
        torch._dynamo.reset()
        counters.clear()
        with encoder_only.changed(
            {"pretrain.max_steps": 5, "pretrain.warmup_steps": 0, "pretrain.compile": compile_}
        ):
            run_stages(encoder_only, "pretrain", "encoder_mlm")  # in this process: its counters
        graphs = counters["stats"]["unique_graphs"]
        assert graphs > 0 if compile_ else graphs == 0, (compile_, dict(counters["stats"]))
        compiled = [bool(_debug_get_cache_entry_list(f.__code__)) for f in (Transformer.forward, token_loss)]
        assert compiled == [compile_, compile_]
        metrics = encoder_only.path / "metrics/pretrain/encoder_mlm.json"
        losses.append(json.loads(metrics.read_text())["train_loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)  # the same training, compiled
    model, config = load_pretrained(encoder_only.path / "checkpoints/encoder_mlm/final")
    assert config["steps"] == 5 and model.num_parameters() > 0


@pytest.mark.parametrize(
    ("arch", "objective"), [("encoder", "mlm"), ("decoder", "clm"), ("encoder_decoder", "span")]
)
def test_a_training_step_never_reads_a_tensor_on_the_host(
    arch: str, objective: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What would make the CPU wait for the GPU at every step: `.item()`, `float()`, a Python `if` on a
    tensor, `.tolist()`, `.cpu()`. The losses are read at the log boundary, in one transfer, and the
    first one that is not finite is reported with its step."""
    from models.pretraining import PretrainModule, make_batch
    from models.training import NonFiniteLoss
    from tests.test_flops import VARIANTS, configs

    model, train = configs(arch, objective, VARIANTS[0])
    module = PretrainModule(model, train)
    monkeypatch.setattr(module, "log", lambda *args, **kwargs: None)  # no Trainer here
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(107, 1000, (train.batch_size, train.row_length()), generator=generator)
    batch = make_batch(rows, train, generator, 1000)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a training step read a tensor on the host")

    with monkeypatch.context() as host:
        for name in ("item", "tolist", "cpu", "__bool__", "__float__", "__int__"):
            host.setattr(torch.Tensor, name, refused)
        loss = module.training_step(batch, 0)
        loss.backward()
        module.on_before_optimizer_step(None)  # the step's loss and gradient norm, logged on the device
    module._read_train_losses()
    assert module.history == [{"step": 0, "train_loss": loss.item()}]
    # under gradient accumulation a step's loss is the mean of its micro-batches'
    module._train_losses += [(1, torch.tensor(2.0)), (1, torch.tensor(3.0)), (2, torch.tensor(5.0))]
    module._read_train_losses()
    assert module.history[1:] == [{"step": 1, "train_loss": 2.5}, {"step": 2, "train_loss": 5.0}]
    module.history.clear()

    module._train_losses += [(1, loss.detach()), (2, loss.detach() * float("nan")), (3, loss.detach())]
    with pytest.raises(NonFiniteLoss, match="^the loss became nan at step 2$"):
        module._read_train_losses()
