"""Typed, validated `params.yaml`.

Every stage calls `load_params()` first: an unknown key, a wrong type or an out-of-range value stops
the stage before any work, with one line naming the dotted key, the value and what is allowed.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from lmpipe.runtime import StageError
from models.config import OBJECTIVE_OF_ARCH, PRESETS, ModelConfig

PARAMS_FILE = Path("params.yaml")

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SampleParams(Strict):
    """The synthetic corpus of the offline default profile."""

    documents: int = Field(600, ge=1, le=1_000_000)
    min_sentences: int = Field(4, ge=1)
    max_sentences: int = Field(12, ge=1)
    files: int = Field(4, ge=1, le=1000)
    lexicon_size: int = Field(400, ge=20, le=100_000)
    glue_train_rows: int = Field(400, ge=1, description="rows per synthetic GLUE task and split")
    glue_dev_rows: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _sentence_range(self) -> SampleParams:
        if self.min_sentences > self.max_sentences:
            raise ValueError(
                f"min_sentences ({self.min_sentences}) must be <= max_sentences ({self.max_sentences})"
            )
        return self


def _input_path(path: str) -> str:
    """A file or folder a stage reads: DVC hashes it (a dep in dvc.yaml), so it must be a real path,
    and one outside the project must be absolute (`dvc exp run --temp` runs in another folder)."""
    if glob.has_magic(path):
        raise ValueError(
            f"'{path}' is a pattern: give the folder as 'path' and the pattern as 'include' "
            "(DVC hashes the folder)"
        )
    if not Path(path).is_absolute() and ".." in Path(path).parts:
        raise ValueError(f"'{path}' leaves the project: give a folder outside it as an absolute path")
    return path


InputPath = Annotated[str, Field(min_length=1), AfterValidator(_input_path)]


class SourceParams(Strict):
    """One ingest source: `path` is what it reads (a file or folder, hashed by DVC), `kind` how."""

    kind: Literal["files", "hf", "disk", "glue"] = "files"
    path: InputPath
    # files: `include` picks files under a folder (glob patterns relative to it; hidden files never)
    include: list[str] = Field(["**/*"], min_length=1)
    format: Literal["auto", "txt", "jsonl", "json", "parquet", "csv"] = "auto"
    split_by: Literal["paragraphs", "chunks", "lines", "file"] = "paragraphs"
    max_doc_chars: int = Field(100_000, ge=100)
    # hf: datasets.load_dataset(path, config, split=split, data_files=data_files), streamed: a local
    # builder (a folder of data files or a loading script); Hub datasets come from `hub` (pinned)
    config: str | None = None
    split: str | None = None
    data_files: str | list[str] | None = None
    max_documents: int | None = Field(None, ge=1)
    text_column: str = "text"
    # glue: the unlabeled text of these tasks' train splits, from a folder glue_prepare wrote
    # (data/glue; null: every task in it)
    tasks: list[str] | None = Field(None, min_length=1)
    synthetic: bool = False

    @field_validator("include")
    @classmethod
    def _relative_patterns(cls, patterns: list[str]) -> list[str]:
        for i, pattern in enumerate(patterns):
            if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
                raise ValueError(f"item {i}, '{pattern}', must be a pattern relative to 'path'")
        return patterns

    @model_validator(mode="after")
    def _kind_fields(self) -> SourceParams:
        if self.kind != "hf" and (self.config or self.data_files):
            raise ValueError(f"'config' and 'data_files' are for 'hf' sources, not '{self.kind}'")
        if self.kind == "glue" and self.split:
            raise ValueError("a 'glue' source reads the train splits: no 'split'")
        if self.kind != "glue" and self.tasks:
            raise ValueError(f"'tasks' is for 'glue' sources, not '{self.kind}'")
        if self.kind != "files" and self.include != ["**/*"]:
            raise ValueError(f"'include' is for 'files' sources, not '{self.kind}'")
        return self


SourceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")]


class IngestParams(Strict):
    """`sources`: name -> source; each is its own stage `ingest@<name>` writing `data/raw/<name>`."""

    sources: dict[SourceName, SourceParams] = Field(min_length=1)
    encoding_errors: Literal["replace", "skip", "fail"] = "replace"
    on_malformed: Literal["fail", "skip"] = "fail"
    workers: int = Field(0, ge=0, description="processes reading a folder's files; 0 = all cores")


class HubParams(Strict):
    """A Hugging Face Hub dataset pinned to a commit: stage `hub@<name>` saves it to `data/hub/<name>`
    (a `save_to_disk` folder that `ingest` reads as a `disk` source, or `glue` as a task folder)."""

    dataset: str = Field(min_length=1, description="the Hub id, e.g. allenai/c4 or nyu-mll/glue")
    config: str | None = None
    split: str | None = Field(None, description="one split; null: every split (a DatasetDict)")
    revision: str = Field(
        pattern=r"^[0-9a-f]{40}$",
        description="the dataset repository's commit sha: a branch or tag can move under the pipeline",
    )
    data_files: str | list[str] | None = None
    max_documents: int | None = Field(None, ge=1, description="stream this many rows of `split` only")

    @model_validator(mode="after")
    def _streamed_split(self) -> HubParams:
        if self.max_documents is not None and self.split is None:
            raise ValueError("'max_documents' streams one split: give 'split'")
        return self


class NearDedupParams(Strict):
    enabled: bool = True
    threshold: float = Field(0.8, gt=0.0, lt=1.0)
    num_perm: int = Field(128, ge=16, le=1024)
    shingle_words: int = Field(5, ge=1, le=20)


class CleanParams(Strict):
    """Quality rules after Gopher (Rae et al. 2021) and C4 (Raffel et al. 2020)."""

    min_chars: int = Field(200, ge=0)
    max_chars: int = Field(1_000_000, ge=1)
    min_words: int = Field(30, ge=0)
    min_mean_word_length: float = Field(2.5, ge=0)
    max_mean_word_length: float = Field(12.0, ge=1)
    min_alpha_ratio: Fraction = 0.6
    max_digit_ratio: Fraction = 0.2
    max_symbol_ratio: Fraction = 0.15
    max_duplicate_line_fraction: Fraction = 0.3
    max_duplicate_line_char_fraction: Fraction = 0.2
    # Gopher: the most frequent n-gram may cover at most this fraction of the characters
    max_top_ngram_char_fraction: dict[int, Fraction] = {2: 0.20, 3: 0.18, 4: 0.16}
    # Gopher: characters inside duplicated n-grams may be at most this fraction
    max_duplicate_ngram_char_fraction: dict[int, Fraction] = {
        5: 0.15,
        6: 0.14,
        7: 0.13,
        8: 0.12,
        9: 0.11,
        10: 0.10,
    }
    bad_phrases: list[str] = ["lorem ipsum"]
    exact_dedup: bool = True
    near_dedup: NearDedupParams = NearDedupParams()
    workers: int = Field(0, ge=0, description="processes for the per-document rules; 0 = all cores")

    @model_validator(mode="after")
    def _ranges(self) -> CleanParams:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be <= max_chars ({self.max_chars})")
        if self.min_mean_word_length > self.max_mean_word_length:
            raise ValueError("min_mean_word_length must be <= max_mean_word_length")
        for key in (*self.max_top_ngram_char_fraction, *self.max_duplicate_ngram_char_fraction):
            if not 1 <= key <= 20:
                raise ValueError(f"n-gram sizes must be between 1 and 20, got {key}")
        return self


class ClusterParams(Strict):
    """Where the data stages run their shards: every core here, or the workers of a Dask cluster. The
    outputs are the same bytes either way, so no stage depends on this section."""

    scheduler: str | None = Field(
        None,
        pattern=r"^(tcp|tls|inproc|ucx)://\S+$",
        description="a Dask scheduler's address (tcp://host:8786); its workers must see this folder",
    )


class TokenizerParams(Strict):
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = Field(4000, ge=200, le=1_000_000)
    character_coverage: float = Field(0.9995, gt=0.0, le=1.0)
    byte_fallback: bool = True
    normalization: Literal["nmt_nfkc", "nfkc", "nmt_nfkc_cf", "nfkc_cf", "identity"] = "nmt_nfkc"
    max_train_chars: int = Field(50_000_000, ge=1000, description="sample of clean text to train on")
    threads: int = Field(0, ge=0, description="0 = all cores")


class PackParams(Strict):
    val_fraction: float = Field(0.05, gt=0.0, lt=1.0)
    threads: int = Field(0, ge=0, description="0 = all cores")
    batch_documents: int = Field(128, ge=1, description="documents per encode task")


class ModelParams(Strict):
    """A named model variant: architecture, objective, a size preset and any overrides of it."""

    arch: Literal["encoder", "decoder", "encoder_decoder"]
    objective: Literal["mlm", "clm", "span"]
    preset: Literal[tuple(PRESETS)] = "tiny"  # type: ignore[valid-type]
    d_model: int | None = Field(None, ge=8)
    n_layers: int | None = Field(None, ge=1)
    n_decoder_layers: int | None = Field(None, ge=1)
    n_heads: int | None = Field(None, ge=1)
    d_ff: int | None = Field(None, ge=1)
    max_len: int | None = Field(None, ge=8)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    mlp: Literal["gelu", "swiglu"] | None = None
    norm: Literal["layernorm", "rmsnorm"] | None = None
    norm_position: Literal["pre", "post"] | None = None
    positions: Literal["learned", "sinusoidal", "rope"] | None = None
    bias: bool | None = None

    @model_validator(mode="after")
    def _objective_fits_arch(self) -> ModelParams:
        expected = OBJECTIVE_OF_ARCH[self.arch]
        if self.objective != expected:
            raise ValueError(
                f"objective '{self.objective}' does not fit arch '{self.arch}' (use '{expected}')"
            )
        return self

    def config_fields(self) -> dict[str, Any]:
        """Preset values overridden by what this variant sets."""
        overrides = self.model_dump(exclude={"arch", "objective", "preset"}, exclude_none=True)
        return {**PRESETS[self.preset], **overrides}

    def config(self, vocab_size: int = ModelConfig.vocab_size) -> ModelConfig:
        """The model code's config of this variant (its own rules checked: a ValueError says which)."""
        return ModelConfig(arch=self.arch, vocab_size=vocab_size, **self.config_fields())


class MLMParams(Strict):
    mask_rate: float = Field(0.15, gt=0.0, lt=1.0)
    mask_fraction: Fraction = 0.8
    random_fraction: Fraction = 0.1

    @model_validator(mode="after")
    def _split(self) -> MLMParams:
        if self.mask_fraction + self.random_fraction > 1.0:
            raise ValueError("mask_fraction + random_fraction must be <= 1 (the rest is kept unchanged)")
        return self


class CLMParams(Strict):
    """Next-token prediction has no knobs; the section exists so DVC can depend on it like the others."""


class SpanParams(Strict):
    noise_density: float = Field(0.15, gt=0.0, lt=1.0)
    mean_span_length: float = Field(3.0, ge=1.0)


class ObjectivesParams(Strict):
    mlm: MLMParams = MLMParams()
    clm: CLMParams = CLMParams()
    span: SpanParams = SpanParams()


class PretrainParams(Strict):
    seq_len: int = Field(128, ge=8)
    batch_size: int = Field(16, ge=1)
    max_steps: int = Field(200, ge=1)
    max_minutes: float | None = Field(None, gt=0, description="wall-clock budget; stops early if reached")
    max_flops: float | None = Field(
        None, gt=0, description="a budget in training FLOPs: it sets the step count in place of max_steps"
    )
    accumulate: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(20, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: Fraction = 0.1
    weight_decay: float = Field(0.01, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.98, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0, description="0 = no clipping")
    sampling: Literal["random", "epoch"] = "random"
    num_workers: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="DataLoader workers; auto: up to 4 per GPU, none on the CPU"
    )
    val_every: int = Field(50, ge=1)
    val_batches: int = Field(4, ge=1)
    checkpoint_every: int = Field(100, ge=1)
    log_every: int = Field(10, ge=1)
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"] = "32-true"
    accelerator: Literal["cpu", "gpu", "auto"] = "cpu"
    devices: int | Literal["auto"] = Field(1, description="processes (GPUs) per node")
    num_nodes: int = Field(1, ge=1, description="nodes of a torchrun or SLURM launch (Lightning's)")
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    compile: bool = False
    models: dict[str, dict[str, Any]] = Field(
        {}, description="per model of `models`: its own values of the keys above (e.g. a step budget)"
    )

    @model_validator(mode="after")
    def _steps(self) -> PretrainParams:
        if self.max_flops is None and self.warmup_steps > self.max_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be <= max_steps ({self.max_steps})")
        if self.precision == "16-mixed" and self.accelerator == "cpu":
            raise ValueError("precision 16-mixed needs a GPU; use bf16-mixed on the CPU")
        if self.strategy == "fsdp" and self.accelerator == "cpu":
            # PyTorch's FSDP needs an accelerator (and Lightning CUDA): said here, before a run starts
            raise ValueError("strategy fsdp needs a GPU; use ddp on the CPU")
        return self


class GlueParams(Strict):
    """Where GLUE comes from: a folder in the original TSV layout, or one of `save_to_disk` folders
    (one per task, e.g. written by `hub` stages from nyu-mll/glue). DVC hashes the folder."""

    source: Literal["tsv", "disk"] = "tsv"
    path: InputPath = Field(description="tsv: the GLUE folder; disk: a folder of <task>/ datasets")
    tasks: list[str] = Field(["sst2", "rte"], min_length=1)
    synthetic: bool = False

    @field_validator("tasks")
    @classmethod
    def _known(cls, tasks: list[str]) -> list[str]:
        from lmpipe.glue.tasks import TASKS

        for i, name in enumerate(tasks):
            if name not in TASKS:
                raise ValueError(f"item {i}, '{name}', is not a GLUE task; the tasks are: {', '.join(TASKS)}")
        return tasks


class FinetuneTaskParams(Strict):
    """The fine-tuning recipe of one GLUE task."""

    lr: float = Field(1e-4, gt=0)
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    max_len: int = Field(128, ge=4, description="[CLS] a [SEP] b [SEP], longest side cut first")
    warmup_ratio: Fraction = 0.1
    max_train_rows: int | None = Field(None, ge=1, description="a seeded sample of the train split")
    max_eval_rows: int | None = Field(None, ge=1, description="the first rows of each evaluation split")


class FinetuneCommonParams(Strict):
    """What every fine-tune shares."""

    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="before the head")
    encoder_pooling: Literal["cls", "mean"] = "cls"
    encdec_pooling: Literal["mean_encoder", "first_decoder"] = "mean_encoder"
    eval_batch_size: int = Field(128, ge=1)
    group_by_length: bool = Field(True, description="batches of similar lengths (less padding)")
    precision: Literal["32-true", "bf16-mixed"] = "32-true"
    accelerator: Literal["cpu", "gpu", "auto"] = "cpu"


class FinetuneParams(Strict):
    """Every pretrained model (and a from-scratch copy of it) fine-tuned on every task of `glue.tasks`,
    once per seed; reports give the median over seeds."""

    seeds: list[Annotated[int, Field(ge=0, le=2**32 - 1)]] = Field([1, 2, 3], min_length=1)
    common: FinetuneCommonParams = FinetuneCommonParams()
    tasks: dict[str, FinetuneTaskParams] = {}

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: dict[str, FinetuneTaskParams]) -> dict[str, FinetuneTaskParams]:
        from lmpipe.glue.tasks import TASKS

        for name in tasks:
            if name not in TASKS:
                raise ValueError(f"'{name}' is not a GLUE task; the tasks are: {', '.join(TASKS)}")
        return tasks


class TrackingParams(Strict):
    experiment: str = Field("lmpipe", min_length=1)


class Params(Strict):
    seed: int = Field(1234, ge=0, le=2**32 - 1)
    tracking: TrackingParams = TrackingParams()
    sample: SampleParams = SampleParams()
    cluster: ClusterParams = ClusterParams()
    hub: dict[SourceName, HubParams] = {}
    ingest: IngestParams
    clean: CleanParams = CleanParams()
    tokenizer: TokenizerParams = TokenizerParams()
    pack: PackParams = PackParams()
    models: dict[str, ModelParams] = {}
    objectives: ObjectivesParams = ObjectivesParams()
    pretrain: PretrainParams = PretrainParams()
    glue: GlueParams = GlueParams(path="data/sample/glue", synthetic=True)
    finetune: FinetuneParams = FinetuneParams()

    def check_model(self, name: str) -> None:
        """A stage's `<model>` argument names a variant of `models`, or one line says which there are."""
        if name not in self.models:
            known = ", ".join(self.models) or "(none)"
            raise StageError(f"params.yaml: models.{name}: no such model; the models are: {known}")

    def pretrain_of(self, model: str) -> PretrainParams:
        """The pretrain section as it applies to `model`: its `pretrain.models.<model>` values on top."""
        overrides = self.pretrain.models.get(model, {})
        return PretrainParams.model_validate({**self.pretrain.model_dump(exclude={"models"}), **overrides})

    @model_validator(mode="after")
    def _pretrain_overrides(self) -> Params:
        for name, overrides in self.pretrain.models.items():
            if name not in self.models:
                raise ValueError(
                    f"pretrain.models.{name}: no such model; the models are: {', '.join(self.models)}"
                )
            if "models" in overrides:
                raise ValueError(f"pretrain.models.{name}.models: unknown key")
            try:
                self.pretrain_of(name)
            except ValidationError as exc:
                raise ValueError(_problems(exc, f"pretrain.models.{name}")) from None
        return self

    @model_validator(mode="after")
    def _models_fit_sequences(self) -> Params:
        for name, variant in self.models.items():
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"models.{name}: model names may use letters, digits, '_' and '-'")
            fields = variant.config_fields()
            seq_len = self.pretrain_of(name).seq_len
            key = (
                f"pretrain.models.{name}.seq_len"
                if "seq_len" in self.pretrain.models.get(name, {})
                else "pretrain.seq_len"
            )
            if fields["max_len"] < seq_len:
                raise ValueError(
                    f"models.{name}.max_len ({fields['max_len']}) is shorter than {key} ({seq_len})"
                )
            try:  # the model's own rules (head sizes, layers per arch), before any stage starts
                variant.config()
            except ValueError as exc:
                raise ValueError(f"models.{name}: {exc}") from None
        return self

    @model_validator(mode="after")
    def _tasks_have_recipes(self) -> Params:
        for i, name in enumerate(self.glue.tasks):
            recipe = self.finetune.tasks.get(name)
            if recipe is None:
                raise ValueError(f"finetune.tasks.{name}: required, glue.tasks[{i}] is '{name}'")
            for model, variant in self.models.items():
                max_len = variant.config_fields()["max_len"]
                if recipe.max_len > max_len:
                    raise ValueError(
                        f"finetune.tasks.{name}.max_len ({recipe.max_len}) is longer than "
                        f"models.{model}.max_len ({max_len})"
                    )
        return self


def _describe(error: dict[str, Any]) -> str:
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
    key = key.removeprefix(".")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    if isinstance(error["input"], dict | list):  # a rule across several keys of one section
        return f"{key}: {message}" if key else message
    return f"{key}={error['input']!r}: {message}" if key else message


def _problems(exc: ValidationError, section: str = "") -> str:
    """Every error of a validation as one line, keys dotted from `section` (the root if empty)."""
    described = []
    for error in exc.errors(include_url=False):
        line = _describe(error)
        described.append(f"{section}{'.' if error['loc'] else ': '}{line}" if section else line)
    return "; ".join(described)


def parse_params(raw: Any, origin: str = str(PARAMS_FILE)) -> Params:
    if not isinstance(raw, dict):
        raise StageError(f"{origin}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise StageError(f"{origin}: {_problems(exc)}") from None


def read_params_yaml(path: Path = PARAMS_FILE) -> Any:
    """params.yaml as written (no defaults filled in): what `dvc exp run -S` overrides refer to."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"{path}: not found (run from the repository root)") from None
    except yaml.YAMLError as exc:
        raise StageError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


def tracking_experiment(path: Path = PARAMS_FILE) -> str:
    """The MLflow experiment params.yaml names, read without validating the other sections: a flow
    opens its run before its stages report what is wrong with them."""
    raw = read_params_yaml(path)
    section = raw.get("tracking") if isinstance(raw, dict) else None
    try:
        return TrackingParams.model_validate(section or {}).experiment
    except ValidationError as exc:
        raise StageError(f"{path}: {_problems(exc, 'tracking')}") from None


def load_params(path: Path = PARAMS_FILE) -> Params:
    return parse_params(read_params_yaml(path), str(path))
