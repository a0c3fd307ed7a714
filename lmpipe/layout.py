"""Where the stages' outputs live, named once: the stages write and read them here, dvc.yaml declares the
same paths (tests/test_codedeps.py checks that it does), and the flows read the reports from here."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SAMPLE = Path("data/sample")
HUB = Path("data/hub")
RAW = Path("data/raw")
CLEAN = Path("data/clean")
CLEAN_WORK = Path("data/.clean-work")  # a run's duplicate pairs and components; not a DVC output
CLEAN_STORE = Path("data/.kept/clean")  # each shard's judged documents and output by digest; not a DVC output
CLEAN_METRICS = Path("metrics/clean.json")
TOKENIZER = Path("data/tokenizer")
SPM_MODEL = TOKENIZER / "spm.model"  # the SentencePiece model the later stages encode with
WEIGHTS = "model.safetensors"  # a model folder's weights (checkpoints/<model>/final, hf)
TOKENS = Path("data/tokens")
PACK_STORE = Path("data/.kept/pack")  # each shard's tokens by digest, kept between runs; not a DVC output
GLUE = Path("data/glue")
CODE_DIGESTS = Path("code.yaml")  # each model's own code by stage (stages/code.py); a params file
FINETUNE = Path("data/finetune")
FINETUNE_CACHE = Path("data/.finetune-cache")  # finished fine-tunes by digest; not a DVC output
PREDICTIONS = Path("data/evaluate/predictions.parquet")
GLUE_METRICS = Path("metrics/glue.json")
GLUE_REPORT = Path("reports/glue.md")
GLUE_TABLE = Path("reports/glue.csv")
GLUE_CHART = Path("reports/glue.png")
GLUE_PLOT = Path("plots/glue.csv")
CHECKPOINTS = Path("checkpoints")


def hub_dir(name: str) -> Path:
    """A pinned Hub dataset as a `save_to_disk` folder (a DVC output)."""
    return HUB / name


def hub_metrics(name: str) -> Path:
    return Path("metrics/hub") / f"{name}.json"


def raw_dir(source: str) -> Path:
    """One ingest source's documents as parquet shards (a DVC output)."""
    return RAW / source


def ingest_store(source: str) -> Path:
    """The files and units an ingest of `source` read, by digest, kept between runs; not a DVC output."""
    return Path("data/.kept/ingest") / source


def ingest_metrics(source: str) -> Path:
    return Path("metrics/ingest") / f"{source}.json"


def clean_shards(folder: Path = CLEAN) -> list[Path]:
    """The clean documents, in corpus order."""
    return sorted(folder.glob("part-*.parquet"))


def final_checkpoint(model: str) -> Path:
    """The exported weights and config that fine-tuning loads (a DVC output)."""
    return CHECKPOINTS / model / "final"


def final_weights(model: str) -> Path:
    return final_checkpoint(model) / WEIGHTS


def hf_export(model: str) -> Path:
    """The pretrained model and tokenizer as a transformers folder (a DVC output)."""
    return CHECKPOINTS / model / "hf"


def project_root() -> Path:
    """The project's folder: `DVC_ROOT`, which DVC sets for every stage to the repository it was started
    in (the workspace's, also for `dvc exp run --temp`, whose temporary copy DVC deletes after the
    run), else the current directory."""
    return Path(os.environ.get("DVC_ROOT") or ".")


def resume_checkpoints(model: str, run_fingerprint: str) -> Path:
    """The Lightning checkpoints of one pretraining run until it has finished: deliberately not a DVC
    output (see dvc.yaml), and in the project's root, so that a run interrupted in a temporary
    experiment resumes there too; a folder per run, so that sweep points training at once keep apart."""
    return project_root() / CHECKPOINTS / model / "resume" / run_fingerprint[:16]


def pretrain_metrics(model: str) -> Path:
    return Path("metrics/pretrain") / f"{model}.json"


def pretrain_curve(model: str) -> Path:
    return Path("plots/pretrain") / f"{model}.csv"


def pretrain_context(model: str) -> Path:
    """The final model's validation loss by evaluation context length, by block of tokens
    (pretrain.context_lengths; no rows without them)."""
    return Path("plots/pretrain_context") / f"{model}.csv"


INITS = ("pretrained", "scratch")  # a model fine-tuned from its pretraining, and its baseline


def finetune_out(model: str) -> Path:
    """Every task and seed fine-tuned from `model`'s pretrained weights and from scratch (a DVC output)."""
    return FINETUNE / model


def finetune_dir(model: str, task: str, init: str) -> Path:
    return finetune_out(model) / init / task


def finetune_stage(model: str) -> str:
    """The name DVC gives the stage that writes `finetune_out(model)`."""
    return f"finetune@{model}"


def finetune_cache(key: str) -> Path:
    """One fine-tune (model, init, task, seed) as it finished, by the digest of all it depends on: a
    stage re-run by a change to one task or seed takes the others from here, and an interrupted one
    resumes. In the project's root, as `resume_checkpoints`; not a DVC output."""
    return project_root() / FINETUNE_CACHE / key[:32]


def predictions_sha256(seed_dir: Path) -> str:
    """The digest of one seed's prediction files: it tags the seed's MLflow run, so that `evaluate` finds
    the run of exactly these predictions while the stage's outputs stay free of run ids."""
    digest = hashlib.sha256()
    for path in sorted(seed_dir.glob("*.parquet")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
