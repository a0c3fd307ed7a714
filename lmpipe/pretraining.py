"""A pretraining run, what stage `pretrain@<model>` calls (`pretrain`): params.yaml as the Lightning
module's config and a step budget, the Trainer, exact resume, the exported weights, the metrics and
the loss curve (models/pretraining.py: the module and its data)."""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from lmpipe.codedeps import code_digest
from lmpipe.layout import (
    TOKENIZER,
    TOKENS,
    WEIGHTS,
    final_checkpoint,
    final_weights,
    pretrain_context,
    pretrain_curve,
    pretrain_metrics,
    resume_checkpoints,
)
from lmpipe.params.models import ModelParams
from lmpipe.params.pretrain import PretrainParams, PretrainSections, section_params
from lmpipe.runtime import (
    StageError,
    atomic_dir,
    atomic_file,
    log,
    read_json,
    sha256_file,
    training_threads,
    write_json,
)
from lmpipe.tracking import WEIGHTS_TAG, flatten, lightning_logger, tracking_experiment


def train_config(arch: str, objective: str, pretrain: PretrainParams, objectives: Any, seed: int) -> Any:
    """params.yaml -> the Lightning module's config: the fields of `pretrain` it has, by name."""
    from models.pretraining import TrainConfig

    shared = {f.name for f in fields(TrainConfig)} & set(PretrainParams.model_fields)
    return TrainConfig(
        arch=arch,
        objective=objective,
        objective_params=section_params(objectives, objective),
        seed=seed,
        **pretrain.model_dump(include=shared),
    )


def fingerprint(stage: str, objective: str, arch: str, *parts: Any) -> str:
    """What a checkpoint must match to be resumed: everything that shapes the run's trajectory, the
    code it runs included (the stage's, `pretrain` or `distill`, and its objective's and
    architecture's, what dvc.yaml and code.yaml declare: a fixed bug must not be resumed around)."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    digest.update(code_digest(f"stages.{stage}", objective, arch).encode())
    return digest.hexdigest()


@contextmanager
def resumable(resume_dir: Path, run_fingerprint: str, is_rank_zero: bool) -> Iterator[Path | None]:
    """The checkpoint to resume from (None: from the start) if an interrupted run with this fingerprint
    left one. Rank zero holds `resume_dir` alone while the run trains (two sweep points that pretrain
    the same thing at once take turns) and deletes it once the run has finished; a run that fails keeps
    it. Other DDP processes read what rank zero prepared."""
    from filelock import FileLock, Timeout

    last, stamp = resume_dir / "last.ckpt", resume_dir / "fingerprint"
    if not is_rank_zero:
        yield last if stamp.exists() and last.exists() else None
        return
    resume_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(resume_dir.with_name(f"{resume_dir.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("pretrain: another process is training the same run in %s; waiting for it", resume_dir)
        lock.acquire()
    try:  # not `with lock`: that would acquire it a second time, and leave it held once on exit
        if stamp.exists() and stamp.read_text() != run_fingerprint:  # another run's folder name
            shutil.rmtree(resume_dir)
        others = [p for p in resume_dir.parent.iterdir() if p.is_dir() and p != resume_dir]
        if others:
            size = sum(f.stat().st_size for p in others for f in p.rglob("*") if f.is_file())
            log.info(
                "pretrain: %s also holds %d other runs' checkpoints (%.2f GB; interrupted, or training"
                " now): delete a folder once its run is abandoned",
                resume_dir.parent,
                len(others),
                size / 1e9,
            )
        resume_dir.mkdir(parents=True, exist_ok=True)
        stamp.write_text(run_fingerprint)
        yield last if last.exists() else None
        shutil.rmtree(resume_dir)  # finished, its outputs written
    finally:
        lock.release()


def export(model_cfg: Any, state: dict[str, Any], out: Path, extra: dict[str, Any]) -> None:
    """The model's weights from the Lightning module's whole `state` (gathered from every process under
    FSDP; a pretraining head such as the pair head left out) and its config, as later stages load them."""
    from safetensors.torch import save_model

    from models.transformer import Transformer

    model = Transformer(model_cfg)
    model.load_state_dict(
        {key.removeprefix("model."): value for key, value in state.items() if key.startswith("model.")}
    )
    with atomic_dir(out) as tmp:
        save_model(model, str(tmp / WEIGHTS))  # save_model stores tied weights once
        (tmp / WEIGHTS).chmod(0o644)
        write_json(tmp / "config.json", {"model": model_cfg.to_dict(), **extra})


def write_curve(path: Path, history: list[dict[str, float]]) -> None:
    rows: dict[int, dict[str, float]] = {}
    for entry in history:
        rows.setdefault(int(entry["step"]), {}).update(entry)
    with atomic_file(path) as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "train_loss", "val_loss"])
        writer.writeheader()
        for step in sorted(rows):
            writer.writerow({"step": step, **{k: v for k, v in rows[step].items() if k != "step"}})


def train_device(run: PretrainParams) -> Any:
    """The kind of device Lightning will train on, as `accelerator` asks."""
    import torch

    gpus = run.accelerator in ("gpu", "auto") and torch.cuda.is_available()
    return torch.device("cuda" if gpus else "cpu")


def world_size(run: PretrainParams) -> int:
    """The processes that will train, on every node: a FLOPs budget is spent by all of them."""
    if isinstance(run.devices, int):
        return run.devices * run.num_nodes
    import torch

    gpus = train_device(run).type == "cuda"
    return (torch.cuda.device_count() if gpus else 1) * run.num_nodes


@dataclass(frozen=True)
class Budget:
    """What `pretrain@<name>` will train, in steps and FLOPs, as params.yaml sets it: the one place the
    step budget is computed (the stage, the flows' plans and the equal-FLOPs presets read it)."""

    run: PretrainParams  # its max_steps the budget's steps, whether max_steps or max_flops set them
    model_cfg: Any  # the model's config
    train_cfg: Any  # the Lightning module's config, the same steps
    flops: tuple[int, int]  # one micro-batch's forward and backward FLOPs: counted, estimated
    micro_batches: int  # a step's micro-batches over every process

    @property
    def steps(self) -> int:
        return self.run.max_steps

    @property
    def step_flops(self) -> int:
        """The training FLOPs of one optimizer step."""
        return self.flops[0] * self.micro_batches

    @property
    def train_flops(self) -> int:
        return self.steps * self.step_flops


def budget(params: PretrainSections, name: str, vocab_size: int) -> Budget:
    """`name`'s steps and FLOPs: max_steps, or the steps `max_flops` pays for when it is set."""
    from models.flops import count_step_flops, estimate_step_flops

    variant, run = params.models[name], params.pretrain_of(name)
    model_cfg = variant.config(vocab_size)
    train_cfg = train_config(variant.arch, variant.objective, run, params.objectives, params.seed)
    flops = (count_step_flops(model_cfg, train_cfg), estimate_step_flops(model_cfg, train_cfg))
    micro_batches = run.accumulate * world_size(run)
    steps = step_budget(name, params, run, flops[0] * micro_batches)
    run = run.model_copy(update={"max_steps": steps})
    return Budget(run, model_cfg, replace(train_cfg, max_steps=steps), flops, micro_batches)


def step_budget(name: str, params: PretrainSections, run: PretrainParams, flops_per_step: int) -> int:
    """max_steps, or the steps `max_flops` pays for when it is set."""
    if run.max_flops is None:
        return run.max_steps
    steps = int(run.max_flops // flops_per_step)
    if steps < max(1, run.warmup_steps):
        key = params.pretrain_key(name, "max_flops")
        raise StageError(
            f"params.yaml: {key}: {run.max_flops:.3g} FLOPs buys {steps} steps of {flops_per_step:.3g} "
            f"FLOPs for {name}, fewer than warmup_steps ({run.warmup_steps}) or 1"
        )
    return steps


def loader_workers(num_workers: int | str, on_gpu: bool, devices: int) -> int:
    """`pretrain.num_workers`; "auto": up to 4 per GPU process from its share of the cores, and none on
    the CPU, where a worker only takes cores from the step."""
    if num_workers != "auto":
        return int(num_workers)
    if not on_gpu:
        return 0
    return min(4, max(1, len(os.sched_getaffinity(0)) // devices))


def strategy_for(strategy: str) -> Any:
    """`pretrain.strategy` as Lightning takes it; fsdp shards each transformer block as its own unit, so
    that one block's weights at a time are gathered whole, not the whole model's."""
    if strategy != "fsdp":
        return strategy
    from lightning.pytorch.strategies import FSDPStrategy

    from models.transformer import Block

    return FSDPStrategy(auto_wrap_policy={Block})


def trainer_for(run: PretrainParams, max_steps: int, resume_dir: Path, logger: Any) -> Any:
    """Lightning's Trainer as params.yaml `pretrain` asks, checkpointing into `resume_dir`."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, TQDMProgressBar

    from models.pretraining import StepCheckpoint

    # in a terminal, a bar that reads the loss (a wait for the GPU) at the log steps, not at every step
    bar = [TQDMProgressBar(refresh_rate=run.log_every)] if os.isatty(2) else []
    return L.Trainer(
        max_steps=max_steps,
        max_time=timedelta(minutes=run.max_minutes) if run.max_minutes else None,
        accelerator=run.accelerator,
        devices=run.devices,
        num_nodes=run.num_nodes,
        strategy=strategy_for(run.strategy),
        precision=run.precision,
        accumulate_grad_batches=run.accumulate,
        gradient_clip_val=run.grad_clip or None,
        val_check_interval=run.val_every * run.accumulate,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=run.log_every,
        logger=logger,
        enable_model_summary=False,
        enable_progress_bar=bool(bar),
        callbacks=[
            StepCheckpoint(
                val_every=run.val_every,
                dirpath=resume_dir,
                filename="step{step}",
                every_n_train_steps=run.checkpoint_every,
                save_top_k=1,
                save_last=True,
                auto_insert_metric_name=False,
            ),
            LearningRateMonitor(logging_interval="step"),
            *bar,
        ],
    )


def summarise(
    trainer: Any, module: Any, run: PretrainParams, objective: str, flops: tuple[int, int]
) -> dict[str, Any]:
    """metrics/pretrain/<model>.json: no wall-clock time (it is in MLflow), so the same params give the
    same bytes. `flops`: one micro-batch's counted and estimated FLOPs. Every process calls it."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    steps, micro_batches = trainer.global_step, run.accumulate * trainer.world_size
    budget = "max_flops" if run.max_flops else "max_steps"
    # every `val/` metric, the heads' too (BERT's next-sentence prediction, ELECTRA's detection); the
    # token loss's keys are named below as well, so that they stand (None) when validation never ran
    val_metrics = {f"val_{key[4:]}": value for key, value in metrics.items() if key.startswith("val/")}
    return {
        "steps": steps,
        "stopped_by": budget if steps >= module.cfg.max_steps else "max_minutes",
        # the rows' positions less their padding (an input format's short rows)
        "tokens_seen": steps * micro_batches * run.batch_size * run.seq_len - module.padded_positions(),
        "flops_per_step": flops[0] * micro_batches,
        "train_flops": steps * micro_batches * flops[0],
        "train_flops_estimate": steps * micro_batches * flops[1],  # 6·N·D + attention + LM head
        "parameters": module.model.num_parameters(),
        "train_loss": next((h["train_loss"] for h in reversed(module.history) if "train_loss" in h), None),
        "val_loss": metrics.get("val/loss"),
        f"val_{objective}_perplexity": metrics.get(f"val/{objective}_perplexity"),
        f"val_{objective}_accuracy": metrics.get(f"val/{objective}_accuracy"),
        **val_metrics,
    }


@dataclass
class Prepared:
    """A pretraining run as it will train: its params resolved (`auto` precision), the packed data's
    meta and its budget (the configs, the steps, a micro-batch's FLOPs counted and estimated); a
    student's distillation (lmpipe/distillation.py) where it is one."""

    name: str
    variant: ModelParams
    run: PretrainParams
    meta: dict[str, Any]
    budget: Budget
    student: Any = None  # lmpipe.distillation.Student: what a distillation adds

    @property
    def stage(self) -> str:
        return f"distill@{self.name}" if self.student is not None else f"pretrain@{self.name}"


def prepared(name: str, params: PretrainSections) -> Prepared:
    """`name`'s run from params.yaml: its configs, this process's threads, its step budget."""
    import torch

    from models.training import resolve_precision

    meta = read_json(TOKENS / "meta.json", "pack")
    planned = budget(params, name, meta["vocab_size"])
    variant, run = params.models[name], planned.run
    # a fixed thread count, whoever starts the stage and beside what: it changes the float bits;
    # OMP_NUM_THREADS too, so that Lightning's launcher and the processes it starts keep it
    threads = training_threads(run.threads, run.devices if isinstance(run.devices, int) else 1)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if run.accelerator == "gpu" and not torch.cuda.is_available():
        raise StageError("params.yaml: pretrain.accelerator=gpu: no CUDA device is visible")
    # `auto` resolved here, so the resume fingerprint and MLflow hold the precision that trains
    run = run.model_copy(update={"precision": resolve_precision(run.precision, train_device(run))})
    return Prepared(name, variant, run, meta, planned)


def pretrain(name: str, params: PretrainSections, student: Callable[[Prepared], Any] | None = None) -> None:
    """Pretrain `name`, resumed where an interrupted run with the same fingerprint stopped, and write
    its outputs: the final weights, the metrics, the loss curve; one MLflow run. `student`: a student's
    distillation for the run (lmpipe/distillation.py: its module, what it adds to the fingerprint, the
    metrics and MLflow)."""
    import torch
    from lightning.pytorch.utilities import rank_zero_only

    from models.training import NonFiniteLoss

    plan = prepared(name, params)
    if student is not None:
        plan = replace(plan, student=student(plan))
    run, train_cfg = plan.run, plan.budget.train_cfg
    _quiet_lightning()
    # resume: the checkpoints of an interrupted run with the same fingerprint, if one left them
    unshaping = {"max_minutes", "num_workers"}  # a wall-clock guard; which processes build the batches
    shaping = (plan.budget.model_cfg.to_dict(), train_cfg.hparams(), run.model_dump(exclude=unshaping))
    if plan.student is not None:  # its teacher's weights and the distillation's settings
        shaping += (plan.student.shaping(),)
    code = (plan.stage.split("@")[0], train_cfg.objective, train_cfg.arch)
    run_fingerprint = fingerprint(*code, *shaping, plan.meta["tokenizer_sha256"], plan.meta["train"])
    resume_dir = resume_checkpoints(name, run_fingerprint)
    with resumable(resume_dir, run_fingerprint, rank_zero_only.rank == 0) as ckpt:
        logger = _tracked(name, params, plan, resume_dir, ckpt is not None)
        torch.manual_seed(params.seed)
        module = _module(plan, train_cfg, run.compile)
        trainer = trainer_for(run, train_cfg.max_steps, resume_dir, logger)
        data = _data(name, plan, trainer, module)
        log.info(
            "%s: %s/%s, %.2fM parameters, %d steps of %.3g FLOPs in %s, %s",
            plan.stage,
            plan.variant.arch,
            plan.variant.objective,
            module.model.num_parameters() / 1e6,
            train_cfg.max_steps,
            plan.budget.step_flops,
            run.precision,
            f"resuming from {ckpt}" if ckpt else "from scratch",
        )
        # train, then one last validation on the final weights
        started = time.perf_counter()
        try:
            trainer.fit(module, datamodule=data, ckpt_path=ckpt)
        except NonFiniteLoss as exc:
            kept = f"the last good checkpoint in {resume_dir} is kept"
            raise StageError(f"{plan.stage}: {exc}; {kept}") from None
        minutes = (time.perf_counter() - started) / 60
        trainer.save_checkpoint(resume_dir / "last.ckpt")
        trainer.validate(module, datamodule=data, verbose=False)
        summary = summarise(trainer, module, run, plan.variant.objective, plan.budget.flops)
        if plan.student is not None:
            summary |= plan.student.summary(summary["steps"])
        state = trainer.strategy.lightning_module_state_dict()  # on every process: FSDP gathers its shards
        if trainer.is_global_zero:
            by_context = _by_context(name, plan, module, logger) if run.context_lengths else {}
            if by_context:
                summary["val_loss_by_context"] = {
                    str(n): float(loss.mean()) for n, loss in by_context.items()
                }
            write_context(pretrain_context(name), by_context)
            _write_outputs(name, plan, module, state, summary, minutes, logger)
        log.info(
            "%s: %d steps in %.1f min, val loss %.3f",
            plan.stage,
            summary["steps"],
            minutes,
            summary["val_loss"] or float("nan"),
        )


def _module(plan: Prepared, train_cfg: Any, compile: bool) -> Any:
    """The Lightning module: a pretraining's, or a student's with its teacher beside it."""
    from models.pretraining import PretrainModule

    if plan.student is not None:
        return plan.student.module(plan.budget.model_cfg, train_cfg, compile)
    return PretrainModule(plan.budget.model_cfg, train_cfg, compile=compile)


def _by_context(name: str, plan: Prepared, module: Any, logger: Any) -> dict[int, Any]:
    """The final model's validation loss at each evaluation context length by block of tokens
    (models/context.py), over the first batch_size streams of up to 4 × the longest length of the
    validation tokens."""
    import numpy as np

    from models.context import BLOCK, evaluable, loss_by_context

    run = plan.run
    tokens = np.memmap(TOKENS / "val.bin", dtype=plan.meta["dtype"], mode="r")
    longest = 4 * max(run.context_lengths)
    blocks = min(len(tokens) // run.batch_size - 1, longest) // BLOCK
    if blocks < 1:
        raise StageError(
            f"pretrain@{name}: {len(tokens)} validation tokens, too few for pretrain.context_lengths"
        )
    skipped = [length for length in run.context_lengths if not evaluable(module.model, length)]
    if skipped:
        log.info(
            "pretrain@%s: context lengths %s exceed max_len and its positions: not measured", name, skipped
        )
    span = 1 + blocks * BLOCK
    losses = loss_by_context(module.model, tokens, run.seq_len, run.context_lengths, run.batch_size, span)
    logger.log_metrics({f"val/context_{length}_loss": float(loss.mean()) for length, loss in losses.items()})
    return losses


def write_context(path: Path, losses: dict[int, Any]) -> None:
    """The loss by context length, a row a block: length, stream, block, loss (its tokens' mean)."""
    import numpy as np

    with atomic_file(path) as handle:
        writer = csv.writer(handle)
        writer.writerow(["length", "stream", "block", "loss"])
        for length, by_block in losses.items():
            for (stream, block), loss in np.ndenumerate(by_block):
                writer.writerow([length, stream, block, f"{loss:.6f}"])


def _quiet_lightning() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # our own lines say what happens
    warnings.filterwarnings("ignore", message=".*exists and is not empty")  # expected when resuming
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")  # Lightning vs torch 2.13
    # validation batches are built once, in memory: workers would only copy them
    warnings.filterwarnings("ignore", message=".*'val_dataloader' does not have many workers")


def _tracked(name: str, params: PretrainSections, plan: Prepared, resume_dir: Path, resumed: bool) -> Any:
    """The run's MLflow logger: one run, continued by a resumed run, its params logged once."""
    variant, meta = plan.variant, plan.meta
    tags = {"model": name, "arch": variant.arch, "objective": variant.objective}
    tags |= {"data.synthetic": meta["synthetic"], "tokenizer_sha256": meta["tokenizer_sha256"]}
    if plan.student is not None:
        tags |= plan.student.tags()
    run_file = resume_dir / "mlflow_run_id"
    logger = lightning_logger(tracking_experiment(), name, run_file, resumed, tags, plan.stage)
    if not resumed:
        logged = {"seed": params.seed, "model": variant.model_dump(exclude_none=True)}
        if plan.student is not None:
            logged["distill"] = plan.student.logged()
        objective = asdict(plan.budget.train_cfg.objective_params)
        logged |= {"objective": objective, "pretrain": plan.run.model_dump()}
        logger.log_hyperparams(flatten(logged))
    return logger


def _data(name: str, plan: Prepared, trainer: Any, module: Any) -> Any:
    """The packed tokens as the trainer reads them (with the piece tables the objective reads), and the
    module's FLOPs for the MFU on a GPU."""
    import torch

    from models.flops import peak_flops
    from models.pieces import piece_tables
    from models.pretraining import TokenDataModule
    from models.specs.objectives import OBJECTIVES

    run, train_cfg, meta = plan.run, plan.budget.train_cfg, plan.meta
    on_gpu = trainer.strategy.root_device.type == "cuda"
    if on_gpu:
        torch.set_float32_matmul_precision("high")  # TF32 for the matmuls autocast leaves in fp32
    workers = loader_workers(run.num_workers, on_gpu, trainer.num_devices)
    parts = OBJECTIVES[train_cfg.objective].components(train_cfg.objective_params)
    tables = [table for _, part, own in parts for table in part.piece_tables(own)]
    pieces = piece_tables(TOKENIZER / "spm.model", tables)  # whole words, spans, sentences
    data = TokenDataModule(
        TOKENS, train_cfg, meta["vocab_size"], meta["dtype"], workers, pin_memory=on_gpu, pieces=pieces
    )
    if trainer.world_size * run.accumulate != plan.budget.micro_batches:
        processes = f"{trainer.world_size} processes, not {world_size(run)}"
        raise StageError(f"{plan.stage}: Lightning trains on {processes}")
    module.step_flops = plan.budget.flops[0]
    if on_gpu:
        device = torch.cuda.get_device_name(trainer.strategy.root_device)
        module.peak_flops = peak_flops(device)
        if module.peak_flops is None:
            log.info("%s: no bf16 peak known for %s (models/flops.py): no MFU", plan.stage, device)
    return data


def _write_outputs(
    name: str, plan: Prepared, module: Any, state: dict, summary: dict, minutes: float, logger: Any
) -> None:
    """The weights later stages load, the metrics and the loss curve; the MLflow run's last metrics."""
    meta = plan.meta
    provenance = {"name": name, "objective": plan.variant.objective, "steps": summary["steps"]}
    provenance |= {"tokenizer_sha256": meta["tokenizer_sha256"], "synthetic": meta["synthetic"]}
    provenance |= {"stage": plan.stage} | (plan.student.tags() if plan.student is not None else {})
    export(plan.budget.model_cfg, state, final_checkpoint(name), provenance)
    # fine-tunes find this run by the digest of the weights they load (no run id in the outputs)
    logger.experiment.set_tag(logger.run_id, WEIGHTS_TAG, sha256_file(final_weights(name)))
    write_json(pretrain_metrics(name), summary)
    write_curve(pretrain_curve(name), module.history)
    final = {"minutes": minutes} | {
        key: summary[key] for key in ("steps", "tokens_seen", "train_flops", "train_flops_estimate")
    }
    logger.log_metrics({f"final/{key}": value for key, value in final.items()})
    logger.finalize("success")
