"""Stage `finetune@<model>-<task>`: fine-tune a pretrained model on one GLUE task, once per seed.

`--init scratch` (stage `finetune_scratch@<model>-<task>`) fine-tunes a randomly initialised copy of the
same architecture with the same recipe: the baseline that says what pretraining bought. Reads
`checkpoints/<model>/final` (pretrained only), `data/tokenizer` and `data/glue/<task>`; writes
`data/finetune/<model>/<task>/<init>/`: `seed<k>/<split>.parquet` predictions (`idx, label,
prediction`) for every evaluation split and `summary.json`. One MLflow run per seed.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmpipe.glue.tasks import TASKS, GlueTask
from lmpipe.layout import GLUE, TOKENIZER, final_checkpoint, finetune_dir, finetune_stage, predictions_sha256
from lmpipe.params.finetune import FinetuneCommonParams, FinetuneSections, FinetuneTaskParams
from lmpipe.params.project import load_stage_params
from lmpipe.runtime import (
    StageError,
    atomic_dir,
    cpu_threads,
    log,
    read_json,
    run_main,
    sha256_file,
    write_json,
)
from lmpipe.tracking import (
    PREDICTIONS_TAG,
    WEIGHTS_TAG,
    find_run,
    finetune_run_key,
    stage_run,
    tracking_experiment,
)


def tokenizer_meta() -> dict[str, Any]:
    meta = read_json(TOKENIZER / "tokenizer.json", "tokenizer")
    model = TOKENIZER / "spm.model"
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

    processor = spm.SentencePieceProcessor(model_file=str(TOKENIZER / "spm.model"))
    columns = [processor.encode(frame[c].tolist(), num_threads=threads) for c in task.text_columns]
    seconds = columns[1] if len(columns) > 1 else [None] * len(frame)
    return [encode_pair(a, b, max_len) for a, b in zip(columns[0], seconds, strict=True)]


def backbone(params: FinetuneSections, name: str, init: str, vocab_size: int, seed: int) -> Any:
    """The pretrained model, or a randomly initialised one of the same configuration."""
    import torch

    from models.training import derived_seed
    from models.transformer import Transformer, load_pretrained

    torch.manual_seed(derived_seed(seed, 0))  # the head's (and a scratch model's) initialisation
    if init == "pretrained":
        return load_pretrained(final_checkpoint(name))[0]
    return Transformer(params.models[name].config(vocab_size))


def check_tokenizer(name: str, tokenizer_sha: str) -> None:
    """Refuse a checkpoint pretrained on another tokenizer's ids."""
    path = final_checkpoint(name) / "config.json"
    config = read_json(path, f"pretrain@{name}")
    if config.get("tokenizer_sha256") != tokenizer_sha:
        raise StageError(
            f"{path}: the model was pretrained with tokenizer {str(config.get('tokenizer_sha256'))[:12]}, "
            f"but data/tokenizer is {tokenizer_sha[:12]}; re-run pretrain@{name} (dvc repro)"
        )


def finetune_config(recipe: FinetuneTaskParams, common: FinetuneCommonParams, seed: int) -> Any:
    """params.yaml -> one seed's fine-tuning config: the fields of the task's recipe and of
    `finetune.common` that it has, by name."""
    from models.finetune import FinetuneConfig

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
    from models.finetune import predict

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.finetune")
    parser.add_argument("model", help="a key of params.yaml: models")
    parser.add_argument("task", help="a task of params.yaml: glue.tasks")
    parser.add_argument("--init", choices=["pretrained", "scratch"], default="pretrained")
    args = parser.parse_args(argv)
    name, init = args.model, args.init
    params = load_stage_params(FinetuneSections)
    params.check_model(name)
    if args.task not in params.glue.tasks:
        raise StageError(
            f"params.yaml: glue.tasks: '{args.task}' is not among them ({', '.join(params.glue.tasks)})"
        )
    task, variant = TASKS[args.task], params.models[name]
    recipe, common = params.finetune.tasks[task.name], params.finetune.common
    stage = finetune_stage(name, task.name, init)
    tok = tokenizer_meta()
    if init == "pretrained":
        check_tokenizer(name, tok["sha256"])
    data = examples(task, recipe, params.seed)
    train_labels = data.train["label"].to_numpy()

    from models.finetune import finetune
    from models.heads import SequenceHead
    from models.training import NonFiniteLoss

    # tracking: one run per seed, linked to the pretrain run of the weights it starts from
    tags = {
        "arch": variant.arch,
        "objective": variant.objective,
        "tokenizer_sha256": tok["sha256"],
        "data.synthetic": params.glue.synthetic,
    }
    weights_sha = None
    if init == "pretrained":
        weights_sha = sha256_file(final_checkpoint(name) / "model.safetensors")
        found = find_run(tracking_experiment(), {"stage": "pretrain", WEIGHTS_TAG: weights_sha})
        if found:
            tags["pretrain_run_id"] = found
    logged_params = {
        f"models.{name}": variant.model_dump(exclude_none=True),
        f"finetune.tasks.{task.name}": recipe.model_dump(),
        "finetune.common": common.model_dump(),
        "init": init,
        "train_rows": len(data.train),
    }

    target = device(common.accelerator)
    pooling = {"encoder": common.encoder_pooling, "encoder_decoder": common.encdec_pooling}
    num_labels = 1 if task.is_regression else len(task.labels or ())
    results: dict[str, Any] = {}
    with atomic_dir(finetune_dir(name, task.name, init)) as tmp:
        for seed in params.finetune.seeds:
            cfg = finetune_config(recipe, common, seed)
            with stage_run(
                "finetune",
                tracking_experiment(),
                {**logged_params, "seed": seed},
                {**tags, **finetune_run_key(name, task.name, init, seed)},
                run_name=f"{stage}/seed{seed}",
            ) as run:
                started = time.perf_counter()
                head = SequenceHead(
                    backbone(params, name, init, tok["vocab_size"], seed),
                    num_labels,
                    pooling=pooling.get(variant.arch),
                    dropout=common.dropout,
                    start_id=tok["bos_id"],
                ).to(target)
                try:
                    losses = finetune(head, data.train_ids, train_labels, cfg)
                except NonFiniteLoss as exc:
                    raise StageError(
                        f"{stage} seed {seed}: {exc}; lower finetune.tasks.{task.name}.lr"
                    ) from None
                run.log_series("train_loss", losses)
                eval_losses = predict_splits(head, data, common, tmp / f"seed{seed}")
                seconds = time.perf_counter() - started
                digest = predictions_sha256(tmp / f"seed{seed}")
                # the GLUE metrics come from `evaluate`, which scores the predictions and logs them here
                run.set_tags({PREDICTIONS_TAG: digest})
                run.log_metrics({"loss": eval_losses, "steps": len(losses), "train_seconds": seconds})
            # no run id or timing here: the same params give the same bytes
            results[str(seed)] = {
                "steps": len(losses),
                "train_loss": losses[-1],
                "eval_loss": eval_losses,
                "predictions_sha256": digest,
            }
            log.info(
                "%s seed %d: %d steps in %.1f s, train loss %.3f, %s",
                stage,
                seed,
                len(losses),
                seconds,
                losses[-1],
                ", ".join(f"{split} loss {loss:.3f}" for split, loss in eval_losses.items()),
            )
        summary = {
            "model": name,
            "task": task.name,
            "init": init,
            "arch": variant.arch,
            "objective": variant.objective,
            "train_rows": len(data.train),
            "eval_rows": {s: len(f) for s, f in data.evaluations.items()},
            "steps": cfg.total_steps(len(data.train)),
            "synthetic": params.glue.synthetic,
            "tokenizer_sha256": tok["sha256"],
            "weights_sha256": weights_sha,  # of the pretrained checkpoint; None from scratch
            "seeds": results,
        }
        write_json(tmp / "summary.json", summary)


if __name__ == "__main__":
    run_main(main)
