"""What stage `finetune@<model>-<task>` is made of: the task's examples encoded, the backbone
(pretrained or from scratch), the recipe as the fine-tuning loop's config, and the predictions of
every evaluation split."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lmpipe.glue.tasks import GlueTask
from lmpipe.layout import GLUE, SPM_MODEL, TOKENIZER, final_checkpoint
from lmpipe.params.finetune import FinetuneCommonParams, FinetuneSections, FinetuneTaskParams
from lmpipe.runtime import (
    StageError,
    cpu_threads,
    read_json,
    sha256_file,
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
