"""What stage `finetune@<model>` is made of: the task's examples encoded, the backbone (pretrained or
from scratch), the recipe as the fine-tuning loop's config, the predictions of every evaluation split,
and the fine-tunes themselves as jobs: one per (task, seed), each a pure function of what its digest
covers, run in this process or in worker processes of a fixed thread count each (models/finetuning.py:
the loop, models/finetune_data.py: the examples' encoding)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmpipe.codedeps import code_digest
from lmpipe.glue.tasks import TASKS, GlueTask
from lmpipe.layout import (
    GLUE,
    INITS,
    SPM_MODEL,
    TOKENIZER,
    final_checkpoint,
    finetune_cache,
    finetune_out,
    hf_export,
    predictions_sha256,
)
from lmpipe.params.finetune import FinetuneCommonParams, FinetuneSections, FinetuneTaskParams
from lmpipe.runtime import (
    StageError,
    atomic_dir,
    cpu_threads,
    read_json,
    setup_logging,
    sha256_file,
    training_threads,
    write_json,
)


def tokenizer_meta() -> dict[str, Any]:
    meta = read_json(TOKENIZER / "tokenizer.json", "tokenizer")
    model = SPM_MODEL
    digest = sha256_file(model)
    if digest != meta["sha256"]:
        raise StageError(
            f"{model}: sha256 {digest[:12]} is not the {meta['sha256'][:12]} that tokenizer.json records; "
            "re-run the tokenizer stage"
        )
    return meta


def read_split(task: GlueTask, split: str) -> pd.DataFrame:
    path = GLUE / task.name / f"{split}.parquet"
    if not path.exists():
        raise StageError(f"{path}: missing; add '{task.name}' to glue.tasks and run glue_prepare")
    frame = pd.read_parquet(path)
    if frame.empty:
        raise StageError(f"{path}: no rows (an empty split)")
    return frame


def encode(frame: pd.DataFrame, task: GlueTask, max_len: int, threads: int) -> list[list[int]]:
    import sentencepiece as spm

    from models.finetune_data import encode_pair

    processor = spm.SentencePieceProcessor(model_file=str(SPM_MODEL))
    columns = [processor.encode(frame[c].tolist(), num_threads=threads) for c in task.text_columns]
    seconds = columns[1] if len(columns) > 1 else [None] * len(frame)
    return [encode_pair(a, b, max_len) for a, b in zip(columns[0], seconds, strict=True)]


def backbone(model: str, init: str, config: Any, seed: int) -> Any:
    """The pretrained `model`, or a randomly initialised one of its configuration."""
    import torch

    from models.training import derived_seed
    from models.transformer import Transformer, load_pretrained

    torch.manual_seed(derived_seed(seed, 0))  # the head's (and a scratch model's) initialisation
    if init == "pretrained":
        return load_pretrained(final_checkpoint(model))[0]
    return Transformer(config)


def check_tokenizer(name: str, tokenizer_sha: str) -> None:
    """Refuse a checkpoint pretrained on another tokenizer's ids."""
    path = final_checkpoint(name) / "config.json"
    config = read_json(path, f"pretrain@{name}")
    if config.get("tokenizer_sha256") != tokenizer_sha:
        raise StageError(
            f"{path}: the model was pretrained with tokenizer {str(config.get('tokenizer_sha256'))[:12]}, "
            f"but data/tokenizer is {tokenizer_sha[:12]}; re-run {config.get('stage', f'pretrain@{name}')} "
            "(dvc repro)"
        )


def finetune_config(recipe: FinetuneTaskParams, common: FinetuneCommonParams, seed: int) -> Any:
    """params.yaml -> one seed's fine-tuning config: the fields of the task's recipe and of
    `finetune.common` that it has, by name."""
    from models.finetuning import FinetuneConfig

    wanted = {f.name for f in fields(FinetuneConfig)}
    return FinetuneConfig(seed=seed, **recipe.model_dump(include=wanted), **common.model_dump(include=wanted))


def device(accelerator: str) -> Any:
    import torch

    if accelerator == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if accelerator == "gpu":
        raise StageError("params.yaml: finetune.common.accelerator=gpu: no CUDA device is visible")
    return torch.device("cpu")


@dataclass
class Examples:
    """A task's rows, encoded: the (sampled) train split and every evaluation split."""

    train: pd.DataFrame
    train_ids: list[list[int]]
    evaluations: dict[str, pd.DataFrame]
    eval_ids: dict[str, list[list[int]]]


def examples(task: GlueTask, recipe: FinetuneTaskParams, seed: int) -> Examples:
    """The same rows for every seed and for both inits: a sample of train fixed by `seed`, whole dev sets."""
    train = read_split(task, "train")
    if recipe.max_train_rows and recipe.max_train_rows < len(train):
        keep = np.random.default_rng(seed).choice(len(train), recipe.max_train_rows, replace=False)
        train = train.iloc[np.sort(keep)].reset_index(drop=True)
    evaluations = {s: read_split(task, s).head(recipe.max_eval_rows) for s in task.eval_splits}
    threads = cpu_threads(0)
    return Examples(
        train,
        encode(train, task, recipe.max_len, threads),
        evaluations,
        {s: encode(frame, task, recipe.max_len, threads) for s, frame in evaluations.items()},
    )


def predict_splits(head: Any, data: Examples, common: FinetuneCommonParams, out: Path) -> dict[str, float]:
    """Predictions of every evaluation split into `out/<split>.parquet`; the loss of each split."""
    from models.finetuning import predict

    out.mkdir()
    losses = {}
    for split, frame in data.evaluations.items():
        labels = frame["label"].to_numpy()
        predictions, losses[split] = predict(
            head, data.eval_ids[split], labels, common.eval_batch_size, common.precision
        )
        rows = pd.DataFrame({"idx": frame["idx"], "label": labels, "prediction": predictions})
        rows.to_parquet(out / f"{split}.parquet", index=False)
    return losses


@dataclass(frozen=True)
class FinetuneJob:
    """One fine-tune: `model` (pretrained or from scratch) on `task` with `seed`. Everything its result
    depends on is here or in the files its digest covers, so that it runs the same in any process."""

    model: str
    init: str
    task: str
    seed: int
    data_seed: int  # params.yaml `seed`: the sample of the train split
    recipe: FinetuneTaskParams
    common: FinetuneCommonParams  # its precision resolved, its threads those the job computes with
    config: Any  # the model's ModelConfig
    objective: str  # its pretraining's: the declaration's code is the fine-tune's too
    pooling: str
    method: str  # finetune.method
    method_params: dict[str, Any]  # its params (finetune.methods.<method>), {} for full fine-tuning
    num_labels: int
    lr_key: str  # the dotted key of the lr, for the advice when the loss diverges

    def digest(self, depends_on: dict[str, str]) -> str:
        """sha256 of the job, the files it reads (`depends_on`: name -> sha256) and the code it runs."""
        job = {
            "model": self.config.to_dict(),
            "init": self.init,
            "task": self.task,
            "seed": self.seed,
            "data_seed": self.data_seed,
            "recipe": self.recipe.model_dump(),
            "common": self.common.model_dump(exclude={"pooling"}),  # its own pooling is the job's
            "pooling": self.pooling,
            "method": {"name": self.method, **self.method_params},
            "files": depends_on,
            "code": code_digest("lmpipe.finetuning", self.objective, self.config.arch),
        }
        return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()


def task_files(task: GlueTask) -> dict[str, str]:
    """The sha256 of a task's splits, by path: what its fine-tunes read."""
    return {str(path): sha256_file(path) for path in sorted((GLUE / task.name).glob("*.parquet"))}


@lru_cache(maxsize=4)
def _examples(task: str, recipe_json: str, data_seed: int) -> Examples:
    """A task's examples once per process, for all the jobs that fine-tune on them."""
    return examples(TASKS[task], FinetuneTaskParams.model_validate_json(recipe_json), data_seed)


def run_job(job: FinetuneJob, out: Path) -> dict[str, Any]:
    """Fine-tune, then write the predictions of every evaluation split and `result.json` into `out`,
    whole or not at all. Returns the result with the loss of every step and the seconds it took, or
    {"error": ...} when the loss diverged."""
    from models.finetune_methods import apply_method, parameter_counts
    from models.finetuning import finetune
    from models.heads import SequenceHead
    from models.training import NonFiniteLoss

    started, clock = time.time(), time.perf_counter()
    data = _examples(job.task, job.recipe.model_dump_json(), job.data_seed)
    head = SequenceHead(
        backbone(job.model, job.init, job.config, job.seed),
        job.num_labels,
        pooling=job.pooling,
        dropout=job.common.dropout,
        lm_loss_weight=job.common.lm_loss_weight,
        frozen=job.method != "full",
    )
    exported = (
        job.method == "lora" and job.init == "pretrained"
    )  # an adapter for peft (models/peft_export.py)
    if exported:
        from models.peft_export import lora_adapter_class

        layout, unexported = lora_adapter_class(head.backbone)  # the export's class, before LoRA renames
    apply_method(head.backbone, job.method, job.method_params, job.seed)
    head = head.to(device(job.common.accelerator))
    trained, total = parameter_counts(head)
    cfg = finetune_config(job.recipe, job.common, job.seed)
    try:
        losses = finetune(head, data.train_ids, data.train["label"].to_numpy(), cfg)
    except NonFiniteLoss as exc:
        return {"error": f"{exc}; lower {job.lr_key}"}
    partial = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    eval_losses = predict_splits(head, data, job.common, partial / "predictions")
    if exported and unexported is None:
        from models.peft_export import write_lora_adapter

        base = str(hf_export(job.model))
        write_lora_adapter(
            partial / "adapter", head.backbone, head.out, layout, job.method_params, job.pooling, base
        )
    result = {
        "train_rows": len(data.train),
        "eval_rows": {split: len(frame) for split, frame in data.evaluations.items()},
        "steps": len(losses),
        "trained_parameters": trained,
        "total_parameters": total,
        "train_loss": losses[-1],
        "eval_loss": eval_losses,
        "predictions_sha256": predictions_sha256(partial / "predictions"),
    }
    write_json(partial / "result.json", result)
    # not atomic_dir: two sweep points may write one entry at once, and it clears other writers' temporaries
    try:
        partial.rename(out)
    except OSError:  # another process finished the same job first: the same bytes
        shutil.rmtree(partial)
    return {**result, "losses": losses, "started": started, "seconds": time.perf_counter() - clock}


def _start_worker(threads: int) -> None:
    import torch

    setup_logging()
    torch.set_num_threads(threads)


def run_jobs(
    jobs: Sequence[FinetuneJob], outs: Sequence[Path], workers: int
) -> Iterator[tuple[FinetuneJob, dict[str, Any]]]:
    """Each job's result as it finishes: in this process one after another, or in `workers` processes
    at once. A job computes with its `common.threads` threads wherever it runs (the thread count
    changes the float bits; how many jobs run at once does not)."""
    threads = training_threads(jobs[0].common.threads) if jobs else 1
    if workers <= 1:
        _start_worker(threads)
        for job, out in zip(jobs, outs, strict=True):
            yield job, run_job(job, out)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawned, not forked: a fork of a process whose OpenMP threads have started can hang
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(threads,))
    with pool:
        futures = {pool.submit(run_job, job, out): job for job, out in zip(jobs, outs, strict=True)}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()


def job_workers(jobs: int, threads: int, on_gpu: bool) -> int:
    """Fine-tunes at once: on the CPU, as many as this stage's share of the cores holds at `threads`
    each (a flow running stages side by side gives each its share as OMP_NUM_THREADS); one on a GPU."""
    if on_gpu or jobs <= 1:
        return 1
    share = int(os.environ.get("OMP_NUM_THREADS") or 0) or cpu_threads(0)
    return max(1, min(jobs, share // training_threads(threads)))


def cached_result(out: Path) -> dict[str, Any] | None:
    """The result of a finished job whose entry is whole, else None."""
    path = out / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


def planned_jobs(
    params: FinetuneSections, name: str, common: FinetuneCommonParams, tokenizer: dict[str, Any], weights: str
) -> tuple[list[FinetuneJob], list[Path]]:
    """Every (task, init, seed) fine-tune of `name`, and where each one's finished result is kept: by
    the digest of what it depends on (a scratch job not on the pretrained weights, so that a new
    pretraining leaves the baselines' results in place)."""
    variant, jobs, outs = params.models[name], [], []
    config = variant.config(tokenizer["vocab_size"])
    method = params.method_params()
    method_params = {} if method is None else method.model_dump(exclude={"lr"})  # the lr is the recipe's
    for task_name in params.glue.tasks:
        task, recipe = TASKS[task_name], params.recipe_of(name, task_name)
        files = task_files(task)
        for init in INITS:
            depends_on = {"tokenizer": tokenizer["sha256"], **files}
            if init == "pretrained":
                depends_on["weights"] = weights
            for seed in params.finetune.seeds:
                job = FinetuneJob(
                    model=name,
                    init=init,
                    task=task_name,
                    seed=seed,
                    data_seed=params.seed,
                    recipe=recipe,
                    common=common,
                    config=config,
                    objective=variant.objective,
                    pooling=common.pooling_of(variant.arch),
                    method=params.finetune.method,
                    method_params=method_params,
                    num_labels=1 if task.is_regression else len(task.labels or ()),
                    lr_key=params.recipe_key(name, task_name, "lr"),
                )
                jobs.append(job)
                outs.append(finetune_cache(job.digest(depends_on)))
    return jobs, outs


def write_finetunes(
    params: FinetuneSections,
    name: str,
    jobs: list[FinetuneJob],
    outs: list[Path],
    tokenizer_sha: str,
    weights: str,
) -> None:
    """data/finetune/<model>/<init>/<task>/: each seed's predictions and the task's summary.json."""
    variant = params.models[name]
    with atomic_dir(finetune_out(name)) as tmp:
        for init in INITS:
            for task_name in params.glue.tasks:
                task_dir = tmp / init / task_name
                task_dir.mkdir(parents=True)
                results = {}
                for job, out in zip(jobs, outs, strict=True):
                    if (job.task, job.init) == (task_name, init):
                        shutil.copytree(out / "predictions", task_dir / f"seed{job.seed}")
                        if (out / "adapter").is_dir():  # a LoRA fine-tune's, for peft
                            shutil.copytree(out / "adapter", task_dir / f"seed{job.seed}" / "adapter")
                        results[str(job.seed)] = cached_result(out)
                first = next(iter(results.values()))
                kept = ("steps", "train_loss", "eval_loss", "predictions_sha256")
                counts = ("trained_parameters", "total_parameters")
                summary = {
                    "model": name,
                    "task": task_name,
                    "init": init,
                    "arch": variant.arch,
                    "objective": variant.objective,
                    "train_rows": first["train_rows"],
                    "eval_rows": first["eval_rows"],
                    "steps": first["steps"],
                    "method": params.finetune.method,
                    **{count: first[count] for count in counts},
                    "synthetic": params.glue.synthetic,
                    "tokenizer_sha256": tokenizer_sha,
                    # of the pretrained checkpoint; None from scratch
                    "weights_sha256": weights if init == "pretrained" else None,
                    "seeds": {seed: {k: result[k] for k in kept} for seed, result in results.items()},
                }
                write_json(task_dir / "summary.json", summary)
