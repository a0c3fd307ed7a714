"""Stage `pretrain@<model>`: train one named model variant of `params.yaml: models` with its objective.

Reads `data/tokens`, writes `checkpoints/<model>/final/{config.json, model.safetensors}` (later stages
load only these), `metrics/pretrain/<model>.json` and the loss curve `plots/pretrain/<model>.csv`.
Lightning checkpoints in `checkpoints/<model>/resume/<fingerprint>` let a re-run after an interruption
continue where it stopped, as long as nothing that shapes the run has changed: beside the DVC outputs,
not one of them, so DVC never deletes them, and in the project's root even when the stage runs in a
temporary experiment (a sweep point, a profile). They are deleted once the run has finished.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from dataclasses import replace

from lmpipe.layout import (
    TOKENIZER,
    TOKENS,
    final_checkpoint,
    final_weights,
    pretrain_curve,
    pretrain_metrics,
    resume_checkpoints,
)
from lmpipe.params.pretrain import PretrainSections
from lmpipe.params.project import load_stage_params
from lmpipe.pretraining import (
    export,
    fingerprint,
    loader_workers,
    resumable,
    step_budget,
    summarise,
    train_config,
    train_device,
    trainer_for,
    world_size,
    write_curve,
)
from lmpipe.runtime import (
    StageError,
    log,
    read_json,
    run_main,
    sha256_file,
    training_threads,
    write_json,
)
from lmpipe.tracking import WEIGHTS_TAG, flatten, lightning_logger, tracking_experiment


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.pretrain")
    parser.add_argument("model", help="a key of params.yaml: models")
    name = parser.parse_args(argv).model
    params = load_stage_params(PretrainSections)
    params.check_model(name)
    variant, run = params.models[name], params.pretrain_of(name)
    meta = read_json(TOKENS / "meta.json", "pack")
    model_cfg = variant.config(meta["vocab_size"])
    train_cfg = train_config(variant.arch, variant.objective, run, params.objectives, params.seed)

    import torch
    from lightning.pytorch.utilities import rank_zero_only

    from models.flops import count_step_flops, estimate_step_flops, peak_flops
    from models.lightning import PretrainModule, TokenDataModule
    from models.pieces import piece_tables
    from models.specs.objectives import OBJECTIVES
    from models.training import NonFiniteLoss, resolve_precision

    # a fixed thread count, whoever starts the stage and beside what: it changes the float bits;
    # OMP_NUM_THREADS too, so that Lightning's launcher and the processes it starts keep it
    threads = training_threads(run.threads, run.devices if isinstance(run.devices, int) else 1)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if run.accelerator == "gpu" and not torch.cuda.is_available():
        raise StageError("params.yaml: pretrain.accelerator=gpu: no CUDA device is visible")
    # `auto` resolved here, so the resume fingerprint and MLflow hold the precision that trains
    run = run.model_copy(update={"precision": resolve_precision(run.precision, train_device(run))})

    # compute: one micro-batch's FLOPs, counted on the meta device; a FLOPs budget becomes steps
    flops = (count_step_flops(model_cfg, train_cfg), estimate_step_flops(model_cfg, train_cfg))
    micro_batches = run.accumulate * world_size(run)
    train_cfg = replace(train_cfg, max_steps=step_budget(name, params, run, flops[0] * micro_batches))

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # our own lines say what happens
    warnings.filterwarnings("ignore", message=".*exists and is not empty")  # expected when resuming
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")  # Lightning vs torch 2.13
    # validation batches are built once, in memory: workers would only copy them
    warnings.filterwarnings("ignore", message=".*'val_dataloader' does not have many workers")

    # resume: the checkpoints of an interrupted run with the same fingerprint, if one left them
    unshaping = {"max_minutes", "num_workers"}  # a wall-clock guard; which processes build the batches
    shaping = (model_cfg.to_dict(), train_cfg.__dict__, run.model_dump(exclude=unshaping))
    run_fingerprint = fingerprint(*shaping, meta["tokenizer_sha256"], meta["train"])
    resume_dir = resume_checkpoints(name, run_fingerprint)
    with resumable(resume_dir, run_fingerprint, rank_zero_only.rank == 0) as ckpt:
        # tracking: one MLflow run, continued by a resumed run
        tags = {"model": name, "arch": variant.arch, "objective": variant.objective}
        tags |= {"data.synthetic": meta["synthetic"], "tokenizer_sha256": meta["tokenizer_sha256"]}
        logger = lightning_logger(
            tracking_experiment(), name, resume_dir / "mlflow_run_id", ckpt is not None, tags
        )
        if ckpt is None:
            logged = {"seed": params.seed, "model": variant.model_dump(exclude_none=True)}
            logged |= {"objective": train_cfg.objective_args, "pretrain": run.model_dump()}
            logger.log_hyperparams(flatten(logged))

        # model, data, trainer
        torch.manual_seed(params.seed)
        module = PretrainModule(model_cfg.to_dict(), train_cfg.__dict__, compile=run.compile)
        trainer = trainer_for(run, train_cfg.max_steps, resume_dir, logger)
        on_gpu = trainer.strategy.root_device.type == "cuda"
        if on_gpu:
            torch.set_float32_matmul_precision("high")  # TF32 for the matmuls autocast leaves in fp32
        workers = loader_workers(run.num_workers, on_gpu, trainer.num_devices)
        parts = OBJECTIVES[train_cfg.objective].components(train_cfg.objective_args)
        tables = [name for _, part, own in parts for name in part.piece_tables(own)]
        pieces = piece_tables(TOKENIZER / "spm.model", tables)  # whole words, spans, sentences
        data = TokenDataModule(
            TOKENS,
            train_cfg,
            meta["vocab_size"],
            meta["dtype"],
            workers,
            pin_memory=on_gpu,
            pieces=pieces,
        )
        if trainer.world_size * run.accumulate != micro_batches:
            processes = f"{trainer.world_size} processes, not {world_size(run)}"
            raise StageError(f"pretrain@{name}: Lightning trains on {processes}")
        module.step_flops = flops[0]
        if on_gpu:
            device = torch.cuda.get_device_name(trainer.strategy.root_device)
            module.peak_flops = peak_flops(device)
            if module.peak_flops is None:
                log.info("pretrain@%s: no bf16 peak known for %s (models/flops.py): no MFU", name, device)
        log.info(
            "pretrain@%s: %s/%s, %.2fM parameters, %d steps of %.3g FLOPs in %s, %s",
            name,
            variant.arch,
            variant.objective,
            module.model.num_parameters() / 1e6,
            train_cfg.max_steps,
            flops[0] * micro_batches,
            run.precision,
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
        summary = summarise(trainer, module, run, variant.objective, flops)
        state = trainer.strategy.lightning_module_state_dict()  # on every process: FSDP gathers its shards

        # outputs: the weights later stages load, the metrics and the loss curve
        if trainer.is_global_zero:
            provenance = {"name": name, "objective": variant.objective, "steps": summary["steps"]}
            provenance |= {"tokenizer_sha256": meta["tokenizer_sha256"], "synthetic": meta["synthetic"]}
            export(model_cfg, state, final_checkpoint(name), provenance)
            # fine-tunes find this run by the digest of the weights they load (no run id in the outputs)
            weights = final_weights(name)
            logger.experiment.set_tag(logger.run_id, WEIGHTS_TAG, sha256_file(weights))
            write_json(pretrain_metrics(name), summary)
            write_curve(pretrain_curve(name), module.history)
            final = {"minutes": minutes} | {
                key: summary[key] for key in ("steps", "tokens_seen", "train_flops", "train_flops_estimate")
            }
            logger.log_metrics({f"final/{key}": value for key, value in final.items()})
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
