"""Stage `pretrain@<model>`: train one named model variant of `params.yaml: models` with its objective.

Reads `data/tokens`, writes `checkpoints/<model>/final/{config.json, model.safetensors}` (later stages
load only these), `metrics/pretrain/<model>.json` and the loss curve `plots/pretrain/<model>.csv`.
Lightning checkpoints in `checkpoints/<model>/resume` (beside the DVC outputs, not one of them, so DVC
never deletes them) let a re-run after an interruption continue where it stopped, as long as nothing
that shapes the run has changed.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from stages.common import (
    StageError,
    atomic_dir,
    atomic_file,
    log,
    read_json,
    run_main,
    sha256_file,
    write_json,
)
from stages.params import Params, load_params
from stages.tracking import DEFAULT_TRACKING_URI, PARENT_RUN_ENV, flatten, git_commit

TOKENS = Path("data/tokens")
MODEL_CODE = Path(__file__).resolve().parents[1] / "models"


def configs(params: Params, name: str, vocab_size: int) -> tuple[Any, Any]:
    from models.config import ModelConfig
    from models.lightning import TrainConfig

    variant = params.models[name]
    try:
        model_cfg = ModelConfig(arch=variant.arch, vocab_size=vocab_size, **variant.config_fields())
    except ValueError as exc:
        raise StageError(f"params.yaml: models.{name}: {exc}") from None
    run = params.pretrain
    objective = params.objectives.model_dump()[variant.objective]
    train_cfg = TrainConfig(
        objective=variant.objective,
        seq_len=run.seq_len,
        batch_size=run.batch_size,
        max_steps=run.max_steps,
        accumulate=run.accumulate,
        lr=run.lr,
        warmup_steps=run.warmup_steps,
        schedule=run.schedule,
        min_lr_ratio=run.min_lr_ratio,
        weight_decay=run.weight_decay,
        beta1=run.beta1,
        beta2=run.beta2,
        grad_clip=run.grad_clip,
        seed=params.seed,
        sampling=run.sampling,
        val_batches=run.val_batches,
        **objective,
    )
    return model_cfg, train_cfg


def fingerprint(*parts: Any) -> str:
    """What a checkpoint must match to be resumed: everything that shapes the run's trajectory,
    the code included (a fixed bug must not be resumed around)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for source in sorted(MODEL_CODE.glob("*.py")) + [Path(__file__)]:
        digest.update(source.read_bytes())
    return digest.hexdigest()


def prepare_resume(resume_dir: Path, run_fingerprint: str, is_rank_zero: bool) -> Path | None:
    """The checkpoint to resume from, if one of the same run is there; else a clean directory."""
    stamp = resume_dir / "fingerprint"
    if not is_rank_zero:
        return resume_dir / "last.ckpt" if stamp.exists() and (resume_dir / "last.ckpt").exists() else None
    if resume_dir.exists() and (not stamp.exists() or stamp.read_text() != run_fingerprint):
        log.info("pretrain: settings changed since the last checkpoint; starting afresh")
        shutil.rmtree(resume_dir)
    resume_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(run_fingerprint)
    last = resume_dir / "last.ckpt"
    return last if last.exists() else None


def mlflow_logger(params: Params, name: str, resume_dir: Path, resuming: bool, tags: dict) -> Any:
    """Lightning's MLflow logger; a resumed run goes on logging into the run it started."""
    from lightning.pytorch.loggers import MLFlowLogger
    from lightning.pytorch.utilities import rank_zero_only

    run_file = resume_dir / "mlflow_run_id"
    run_id = run_file.read_text().strip() if resuming and run_file.exists() else None
    logger = MLFlowLogger(
        experiment_name=params.tracking.experiment,
        run_name=f"pretrain@{name}",
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI,
        tags=None if run_id else tags,
        run_id=run_id,
    )
    if rank_zero_only.rank == 0:  # only rank 0 has a run (DDP/FSDP start one process per device)
        run_file.write_text(logger.run_id)
    return logger


def export(module: Any, out: Path, extra: dict[str, Any]) -> None:
    from safetensors.torch import save_model

    with atomic_dir(out) as tmp:
        save_model(module.model, str(tmp / "model.safetensors"))  # save_model stores tied weights once
        (tmp / "model.safetensors").chmod(0o644)
        write_json(tmp / "config.json", {"model": module.model_cfg.to_dict(), **extra})


def write_curve(path: Path, history: list[dict[str, float]]) -> None:
    rows: dict[int, dict[str, float]] = {}
    for entry in history:
        rows.setdefault(int(entry["step"]), {}).update(entry)
    with atomic_file(path) as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "train_loss", "val_loss"])
        writer.writeheader()
        for step in sorted(rows):
            writer.writerow({"step": step, **{k: v for k, v in rows[step].items() if k != "step"}})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.pretrain")
    parser.add_argument("model", help="a key of params.yaml: models")
    name = parser.parse_args(argv).model
    params = load_params()
    if name not in params.models:
        known = ", ".join(params.models) or "(none)"
        raise StageError(f"params.yaml: models.{name}: no such model; the models are: {known}")
    variant = params.models[name]
    meta = read_json(TOKENS / "meta.json", "pack")
    model_cfg, train_cfg = configs(params, name, meta["vocab_size"])

    import lightning as L
    import torch

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # our own lines say what happens
    warnings.filterwarnings("ignore", message=".*exists and is not empty")  # expected when resuming
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")  # Lightning vs torch 2.13
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from models.lightning import NonFiniteLoss, PretrainModule, TokenDataModule

    run = params.pretrain
    resume_dir = Path("checkpoints") / name / "resume"
    run_fingerprint = fingerprint(
        model_cfg.to_dict(),
        train_cfg.__dict__,
        run.model_dump(exclude={"max_minutes"}),
        meta["tokenizer_sha256"],
        meta["train"],
    )
    from lightning.pytorch.utilities import rank_zero_only

    ckpt = prepare_resume(resume_dir, run_fingerprint, rank_zero_only.rank == 0)
    tags = {
        "stage": "pretrain",
        "model": name,
        "arch": variant.arch,
        "objective": variant.objective,
        "git_commit": git_commit(),
        "data.synthetic": str(meta["synthetic"]),
        "tokenizer_sha256": meta["tokenizer_sha256"],
    }
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    if os.environ.get(PARENT_RUN_ENV):
        tags["mlflow.parentRunId"] = os.environ[PARENT_RUN_ENV]
    logger = mlflow_logger(params, name, resume_dir, ckpt is not None, tags)
    if ckpt is None:
        logger.log_hyperparams(
            flatten(
                {
                    "seed": params.seed,
                    "model": variant.model_dump(exclude_none=True),
                    "objective": params.objectives.model_dump()[variant.objective],
                    "pretrain": run.model_dump(),
                }
            )
        )
    torch.manual_seed(params.seed)
    module = PretrainModule(model_cfg.to_dict(), train_cfg.__dict__, compile=run.compile)
    data = TokenDataModule(TOKENS, train_cfg, meta["vocab_size"], meta["dtype"], run.num_workers)
    trainer = L.Trainer(
        max_steps=run.max_steps,
        max_time=timedelta(minutes=run.max_minutes) if run.max_minutes else None,
        accelerator=run.accelerator,
        devices=run.devices,
        strategy=run.strategy,
        precision=run.precision,
        accumulate_grad_batches=run.accumulate,
        gradient_clip_val=run.grad_clip or None,
        val_check_interval=run.val_every * run.accumulate,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=run.log_every,
        logger=logger,
        enable_model_summary=False,
        enable_progress_bar=None if os.isatty(2) else False,
        callbacks=[
            ModelCheckpoint(
                dirpath=resume_dir,
                filename="step{step}",
                every_n_train_steps=run.checkpoint_every,
                save_top_k=1,
                save_last=True,
                auto_insert_metric_name=False,
            ),
            LearningRateMonitor(logging_interval="step"),
        ],
    )
    log.info(
        "pretrain@%s: %s/%s, %.2fM parameters, %s",
        name,
        variant.arch,
        variant.objective,
        module.model.num_parameters() / 1e6,
        f"resuming from {ckpt}" if ckpt else "from scratch",
    )
    started = time.perf_counter()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    except NonFiniteLoss as exc:
        raise StageError(
            f"pretrain@{name}: {exc}; the last good checkpoint in {resume_dir} is kept"
        ) from None
    minutes = (time.perf_counter() - started) / 60
    trainer.save_checkpoint(resume_dir / "last.ckpt")
    trainer.validate(module, datamodule=data, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    steps = trainer.global_step
    # no wall-clock time here (it is in MLflow): the same params give the same bytes
    summary = {
        "steps": steps,
        "stopped_by": "max_steps" if steps >= run.max_steps else "max_minutes",
        "tokens_seen": steps * run.accumulate * run.batch_size * run.seq_len * trainer.world_size,
        "parameters": module.model.num_parameters(),
        "train_loss": next((h["train_loss"] for h in reversed(module.history) if "train_loss" in h), None),
        "val_loss": metrics.get("val/loss"),
        f"val_{variant.objective}_perplexity": metrics.get(f"val/{variant.objective}_perplexity"),
        f"val_{variant.objective}_accuracy": metrics.get(f"val/{variant.objective}_accuracy"),
    }
    if trainer.is_global_zero:
        export(
            module,
            Path("checkpoints") / name / "final",
            {
                "name": name,
                "objective": variant.objective,
                "tokenizer_sha256": meta["tokenizer_sha256"],
                "steps": steps,
                "synthetic": meta["synthetic"],
            },
        )
        # fine-tunes find this run by the digest of the weights they load (no run id in the outputs)
        weights = Path("checkpoints") / name / "final" / "model.safetensors"
        logger.experiment.set_tag(logger.run_id, "weights_sha256", sha256_file(weights))
        write_json(Path("metrics/pretrain") / f"{name}.json", summary)
        write_curve(Path("plots/pretrain") / f"{name}.csv", module.history)
        logger.log_metrics({"final/steps": steps, "final/minutes": minutes})
        logger.finalize("success")
    log.info(
        "pretrain@%s: %d steps in %.1f min, val loss %.3f",
        name,
        steps,
        minutes,
        summary["val_loss"] or float("nan"),
    )


if __name__ == "__main__":
    run_main(main)
