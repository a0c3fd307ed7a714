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
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

from stages.codedeps import ROOT, code_files
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
from stages.layout import TOKENS, final_checkpoint, pretrain_curve, pretrain_metrics, resume_checkpoints
from stages.params import ObjectivesParams, PretrainParams, load_params
from stages.tracking import WEIGHTS_TAG, flatten, lightning_logger


def train_config(objective: str, pretrain: PretrainParams, objectives: ObjectivesParams, seed: int) -> Any:
    """params.yaml -> the Lightning module's config: the fields of `pretrain` it has, by name."""
    from models.lightning import TrainConfig

    shared = {f.name for f in fields(TrainConfig)} & set(PretrainParams.model_fields)
    return TrainConfig(
        objective=objective,
        objective_args=getattr(objectives, objective).model_dump(),
        seed=seed,
        **pretrain.model_dump(include=shared),
    )


def fingerprint(*parts: Any) -> str:
    """What a checkpoint must match to be resumed: everything that shapes the run's trajectory, the
    stage's code included (the files dvc.yaml declares: a fixed bug must not be resumed around)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for source in code_files("stages.pretrain"):
        digest.update(source.encode() + b"\0" + (ROOT / source).read_bytes())
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


def trainer_for(run: PretrainParams, resume_dir: Path, logger: Any) -> Any:
    """Lightning's Trainer as params.yaml `pretrain` asks, checkpointing into `resume_dir`."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    return L.Trainer(
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


def summarise(trainer: Any, module: Any, run: PretrainParams, objective: str) -> dict[str, Any]:
    """metrics/pretrain/<model>.json: no wall-clock time (it is in MLflow), so the same params give the
    same bytes."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    steps = trainer.global_step
    return {
        "steps": steps,
        "stopped_by": "max_steps" if steps >= run.max_steps else "max_minutes",
        "tokens_seen": steps * run.accumulate * run.batch_size * run.seq_len * trainer.world_size,
        "parameters": module.model.num_parameters(),
        "train_loss": next((h["train_loss"] for h in reversed(module.history) if "train_loss" in h), None),
        "val_loss": metrics.get("val/loss"),
        f"val_{objective}_perplexity": metrics.get(f"val/{objective}_perplexity"),
        f"val_{objective}_accuracy": metrics.get(f"val/{objective}_accuracy"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.pretrain")
    parser.add_argument("model", help="a key of params.yaml: models")
    name = parser.parse_args(argv).model
    params = load_params()
    if name not in params.models:
        known = ", ".join(params.models) or "(none)"
        raise StageError(f"params.yaml: models.{name}: no such model; the models are: {known}")
    variant, run = params.models[name], params.pretrain_of(name)
    meta = read_json(TOKENS / "meta.json", "pack")
    model_cfg = variant.config(meta["vocab_size"])
    train_cfg = train_config(variant.objective, run, params.objectives, params.seed)

    import torch
    from lightning.pytorch.utilities import rank_zero_only

    from models.lightning import PretrainModule, TokenDataModule
    from models.objectives import NonFiniteLoss

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # our own lines say what happens
    warnings.filterwarnings("ignore", message=".*exists and is not empty")  # expected when resuming
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")  # Lightning vs torch 2.13

    # resume: a checkpoint of the very same run, if an interrupted one left it
    resume_dir = resume_checkpoints(name)
    shaping = (model_cfg.to_dict(), train_cfg.__dict__, run.model_dump(exclude={"max_minutes"}))
    run_fingerprint = fingerprint(*shaping, meta["tokenizer_sha256"], meta["train"])
    ckpt = prepare_resume(resume_dir, run_fingerprint, rank_zero_only.rank == 0)

    # tracking: one MLflow run, continued by a resumed run
    tags = {"model": name, "arch": variant.arch, "objective": variant.objective}
    tags |= {"data.synthetic": meta["synthetic"], "tokenizer_sha256": meta["tokenizer_sha256"]}
    logger = lightning_logger(
        params.tracking.experiment, name, resume_dir / "mlflow_run_id", ckpt is not None, tags
    )
    if ckpt is None:
        logged = {"seed": params.seed, "model": variant.model_dump(exclude_none=True)}
        logged |= {"objective": train_cfg.objective_args, "pretrain": run.model_dump()}
        logger.log_hyperparams(flatten(logged))

    # model, data, trainer
    torch.manual_seed(params.seed)
    module = PretrainModule(model_cfg.to_dict(), train_cfg.__dict__, compile=run.compile)
    data = TokenDataModule(TOKENS, train_cfg, meta["vocab_size"], meta["dtype"], run.num_workers)
    trainer = trainer_for(run, resume_dir, logger)
    log.info(
        "pretrain@%s: %s/%s, %.2fM parameters, %s",
        name,
        variant.arch,
        variant.objective,
        module.model.num_parameters() / 1e6,
        f"resuming from {ckpt}" if ckpt else "from scratch",
    )

    # train, then one last validation on the final weights
    started = time.perf_counter()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    except NonFiniteLoss as exc:
        kept = f"the last good checkpoint in {resume_dir} is kept"
        raise StageError(f"pretrain@{name}: {exc}; {kept}") from None
    minutes = (time.perf_counter() - started) / 60
    trainer.save_checkpoint(resume_dir / "last.ckpt")
    trainer.validate(module, datamodule=data, verbose=False)
    summary = summarise(trainer, module, run, variant.objective)

    # outputs: the weights later stages load, the metrics and the loss curve
    if trainer.is_global_zero:
        provenance = {"name": name, "objective": variant.objective, "steps": summary["steps"]}
        provenance |= {"tokenizer_sha256": meta["tokenizer_sha256"], "synthetic": meta["synthetic"]}
        export(module, final_checkpoint(name), provenance)
        # fine-tunes find this run by the digest of the weights they load (no run id in the outputs)
        weights = final_checkpoint(name) / "model.safetensors"
        logger.experiment.set_tag(logger.run_id, WEIGHTS_TAG, sha256_file(weights))
        write_json(pretrain_metrics(name), summary)
        write_curve(pretrain_curve(name), module.history)
        logger.log_metrics({"final/steps": summary["steps"], "final/minutes": minutes})
        logger.finalize("success")
    log.info(
        "pretrain@%s: %d steps in %.1f min, val loss %.3f",
        name,
        summary["steps"],
        minutes,
        summary["val_loss"] or float("nan"),
    )


if __name__ == "__main__":
    run_main(main)
