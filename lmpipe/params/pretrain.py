"""The pretraining sections: `objectives`, `pretrain`, and their rules across `models`."""

from __future__ import annotations

from dataclasses import MISSING, fields
from functools import cache
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import Field, ValidationError, create_model, field_validator, model_validator

from lmpipe.params.models import ModelsSections
from lmpipe.params.schema import Fraction, Strict, _problems
from models.specs.architectures import ARCHITECTURES
from models.specs.input_formats import PAIR_FORMATS, InputFormat
from models.specs.objectives import OBJECTIVES, ObjectiveParams, ObjectiveSpec


@cache
def _section_model(objective: ObjectiveSpec) -> type[Strict]:
    """The schema of `objectives.<name>`: the objective's params dataclass, its fields' metadata the
    bounds and description, its `check` the rules across fields (cached by the declaration: an
    objective registered again gets its own)."""
    params = objective.Params
    hints = get_type_hints(params)

    def _rules(section: Strict) -> Strict:
        if objective.kind is None:  # a mixture: each component's params against its own schema
            _components_in_bounds(section.model_dump()["components"])
        params(**section.model_dump()).check()
        return section

    return create_model(
        params.__name__,
        __base__=Strict,
        __validators__={"_rules": model_validator(mode="after")(_rules)},
        **{f.name: (hints[f.name], _field(f)) for f in fields(params)},
    )


def _components_in_bounds(components: Any) -> None:
    """Each mixture component's `args` validated by its objective's section schema (the one place bounds
    are checked); what is not a component (models/specs/objectives/mixture.py says) is left to its check."""
    if not isinstance(components, dict):
        return
    for name, component in components.items():
        objective = OBJECTIVES.get(component.get("objective")) if isinstance(component, dict) else None
        if objective is None or objective.kind is None:
            continue
        try:
            _section_model(objective).model_validate(component.get("args") or {})
        except ValidationError as exc:
            raise ValueError(_problems(exc, f"components.{name}.args")) from None


def _field(spec: Any) -> Any:
    """A dataclass field as pydantic's: its default (or default factory), bounds and description."""
    if spec.default is MISSING:
        return Field(default_factory=spec.default_factory, **spec.metadata)
    return Field(spec.default, **spec.metadata)


@cache
def _objectives_model(registered: tuple[str, ...]) -> type[Strict]:
    sections = {name: _section_model(OBJECTIVES[name]) for name in registered}
    return create_model(
        "ObjectivesParams", __base__=Strict, **{name: (model, model()) for name, model in sections.items()}
    )


def objectives_params(sections: Any = None) -> Strict:
    """params.yaml's `objectives`: one section per registered objective (models/objectives), each
    validated by the objective's own params class; an objective registered after import is seen."""
    return _objectives_model(tuple(OBJECTIVES)).model_validate(sections or {})


def section_params(objectives: Strict, name: str) -> ObjectiveParams:
    """`objectives.<name>`, validated, as its declaration's params class: what the objective receives."""
    return OBJECTIVES[name].Params(**getattr(objectives, name).model_dump())


def longest_read(arch: str, objective: str, seq_len: int, params: ObjectiveParams) -> int:
    """The most tokens a stack of `arch` reads of a row of `objective` at `seq_len`: what its max_len
    must hold."""
    return max(
        max(ARCHITECTURES[arch].tokens(part.kind, inputs, targets, 0.0)[:2])
        for _, part, own in OBJECTIVES[objective].components(params)
        for inputs, targets in part.longest(seq_len, own)
    )


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
    sampling: Literal["random", "epoch", "stream"] = Field(
        "random",
        description="random: rows at random offsets; epoch: the packed rows in a seeded order, epoch by "
        "epoch; stream: Transformer-XL's ordered batches, the tokens cut into batch_size × accumulate × "
        "processes streams and each row slot reading its stream's next segment every step (what "
        "models.<name>.mem_len needs)",
    )
    input_format: InputFormat = Field(
        "full_sentences",
        description="RoBERTa's input formats (models/input_formats.py): full_sentences (windows of the "
        "packed stream, across documents), doc_sentences (whole sentences of one document), segment_pair "
        "(BERT's: [CLS] A [SEP] B [SEP], segments of sentences), sentence_pair (one sentence each); all "
        "but full_sentences need pack.sentences, the masked LM and random sampling; the pairs train "
        "objectives.mlm.pair_loss on [CLS]",
    )
    short_seq_prob: Fraction = Field(
        0.0,
        description="segment_pair's short rows: the chance that a row gathers sentences up to a random "
        "length in [2, the row's] (BERT's create_pretraining_data.py: 0.1; RoBERTa: none)",
    )
    num_workers: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="DataLoader workers; auto: up to 4 per GPU, none on the CPU"
    )
    context_lengths: list[Annotated[int, Field(ge=2)]] = Field(
        [],
        description="evaluation context lengths at which the final model's validation loss is measured "
        "over the same tokens (models/context.py; a causal decoder's): a positions: xl decoder attends "
        "beyond seq_len through its memory, any other up to its max_len (longer ones are left out); "
        "metrics/pretrain/<model>.json's val_loss_by_context",
    )
    val_every: int = Field(50, ge=1)
    val_batches: int = Field(4, ge=1)
    checkpoint_every: int = Field(100, ge=1)
    log_every: int = Field(10, ge=1)
    precision: Literal["auto", "32-true", "bf16-mixed", "16-mixed", "bf16-true"] = Field(
        "32-true", description="auto: bf16-mixed where bf16 is native (a GPU, AVX512-BF16, AMX), else 32-true"
    )
    accelerator: Literal["cpu", "gpu", "auto"] = "cpu"
    devices: int | Literal["auto"] = Field(1, description="processes (GPUs) per node")
    num_nodes: int = Field(1, ge=1, description="nodes of a torchrun or SLURM launch (Lightning's)")
    strategy: Literal["auto", "ddp", "fsdp"] = "auto"
    compile: bool = Field(False, description="torch.compile the model and its loss")
    threads: int = Field(
        0,
        ge=0,
        description="CPU threads of each training process (0 = its share of the cores: all of them over "
        "the processes per node). The thread count changes the float bits, so it is a param",
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


class PretrainSections(ModelsSections):
    """The sections `pretrain@<model>` reads, and what they must agree on."""

    objectives: Any = Field(default_factory=dict, validate_default=True)
    pretrain: PretrainParams = PretrainParams()

    @field_validator("objectives", mode="before")
    @classmethod
    def _objectives(cls, sections: Any) -> Strict:
        return objectives_params(sections)

    def objective_recipe(self, model: str) -> dict[str, Any]:
        """The pretrain values `model`'s objective sets for it (ELECTRA's lr), under its own."""
        objective = self.models[model].objective
        lr = getattr(getattr(self.objectives, objective), "lr", None)
        return {} if lr is None else {"lr": lr}

    def pretrain_of(self, model: str) -> PretrainParams:
        """The pretrain section as it applies to `model`: its objective's recipe (`objective_recipe`) and
        its own `models.<model>.pretrain` values on top."""
        own = self.models[model].pretrain
        return PretrainParams.model_validate(
            {**self.pretrain.model_dump(), **self.objective_recipe(model), **own}
        )

    def pretrain_key(self, model: str, key: str) -> str:
        """The dotted key that sets `key` for `model`: its own `models.<model>.pretrain`, its objective's
        or the section's."""
        if key in self.models[model].pretrain:
            return f"{self.model_key(model)}.pretrain.{key}"
        if key in self.objective_recipe(model):
            return f"objectives.{self.models[model].objective}.{key}"
        return f"pretrain.{key}"

    @model_validator(mode="after")
    def _pretrain_overrides(self) -> PretrainSections:
        for name in self.models:
            try:
                self.pretrain_of(name)
            except ValidationError as exc:
                raise ValueError(_problems(exc, f"{self.model_key(name)}.pretrain")) from None
        return self

    @model_validator(mode="after")
    def _students_learn_the_lm_head(self) -> PretrainSections:
        for name, student in self.distill.students.items():
            if name not in self.models:  # its teacher's own error is said on its own keys
                continue
            params = section_params(self.objectives, student.objective)
            headed = [
                p.name for _, p, own in OBJECTIVES[student.objective].components(params) if p.has_head(own)
            ]
            if headed:
                raise ValueError(
                    f"distill.students.{name}.teacher: objective {student.objective} trains a head of its "
                    f"own ({headed[0]}'s), not kept with models.{student.teacher}; a student learns the "
                    "teacher's LM head outputs"
                )
            fmt = self.pretrain_of(name).input_format
            if fmt in PAIR_FORMATS and getattr(params, "pair_loss", "none") != "none":
                raise ValueError(
                    f"{self.pretrain_key(name, 'input_format')}: {fmt} trains objectives.{student.objective}"
                    f".pair_loss, a head the teacher does not keep: a student (distill.students.{name}) "
                    "trains without it, as DistilBERT does"
                )
        return self

    @model_validator(mode="after")
    def _models_fit_sequences(self) -> PretrainSections:
        for name, variant in self.models.items():
            run = self.pretrain_of(name)
            max_len, seq_len = variant.config_fields()["max_len"], run.seq_len
            key = self.pretrain_key(name, "seq_len")
            if max_len < seq_len:
                raise ValueError(f"models.{name}.max_len ({max_len}) is shorter than {key} ({seq_len})")
            params = section_params(self.objectives, variant.objective)
            arch = ARCHITECTURES[variant.arch]
            parts = OBJECTIVES[variant.objective].components(params)
            for _, part, _ in parts:
                if part.kind not in arch.fits:
                    takes = ", ".join(sorted(arch.fits))
                    raise ValueError(
                        f"models.{name}.objective: {variant.objective}'s component {part.name} makes "
                        f"{part.kind} pairs, which arch '{arch.name}' does not take ({takes})"
                    )
            static = [part.name for _, part, own in parts if part.static_copies(own)]
            sampling, fmt = run.sampling, run.input_format
            formats = OBJECTIVES[variant.objective].pair_formats
            if fmt != "full_sentences" and (not formats or sampling != "random"):
                wrong = (
                    f"models.{name}.objective is {variant.objective}"
                    if not formats
                    else f"{self.pretrain_key(name, 'sampling')} is {sampling}"
                )
                takes = ", ".join(o.name for o in OBJECTIVES.values() if o.pair_formats)
                raise ValueError(
                    f"{self.pretrain_key(name, 'input_format')}: {fmt} draws its rows of an objective "
                    f"that trains input formats ({takes}) at random sentences (sampling random); {wrong}"
                )
            if run.short_seq_prob and fmt != "segment_pair":
                raise ValueError(
                    f"{self.pretrain_key(name, 'short_seq_prob')}: short rows are drawn for segment pairs "
                    f"(BERT's), and {self.pretrain_key(name, 'input_format')} is {fmt} (models.{name})"
                )
            pair_loss = getattr(params, "pair_loss", "none")
            if fmt in PAIR_FORMATS and pair_loss != "none" and getattr(params, "boundary_loss", False):
                raise ValueError(
                    "objectives.mlm.boundary_loss: SpanBERT's boundary objective trains single segments, "
                    f"and {self.pretrain_key(name, 'input_format')} {fmt} trains the pair loss "
                    f"objectives.mlm.pair_loss {pair_loss} (models.{name}): set one of them off"
                )
            if static and sampling != "epoch":
                raise ValueError(
                    f"objectives.{static[0]}.masking: static masking fixes the masks of each row of the "
                    f"data, which needs {self.pretrain_key(name, 'sampling')}: epoch (fixed rows), not "
                    f"{sampling} (models.{name})"
                )
            if run.context_lengths and variant.arch != "decoder":
                raise ValueError(
                    f"{self.pretrain_key(name, 'context_lengths')}: the loss by context length is a causal "
                    f"decoder's, and models.{name} is arch {variant.arch}"
                )
            mem_len = variant.config_fields().get("mem_len", 0)
            if mem_len and sampling != "stream":
                raise ValueError(
                    f"models.{name}.mem_len: Transformer-XL's memory continues the previous segment of the "
                    f"same stream, which needs {self.pretrain_key(name, 'sampling')}: stream, not {sampling}"
                )
            objective = OBJECTIVES[variant.objective]
            if mem_len and objective.has_head(params) and not objective.head_takes_memory(params):
                raise ValueError(
                    f"models.{name}.mem_len: objective {variant.objective}'s head runs the model without "
                    "its memory; Transformer-XL's recurrence trains the model's own LM head"
                )
            fields = variant.config().to_dict()
            for key, needed in objective.model_needs(params).items():
                allowed = needed if isinstance(needed, tuple) else (needed,)
                if fields.get(key) not in allowed:
                    raise ValueError(
                        f"models.{name}.{key}: objective {variant.objective} needs {key} "
                        f"{' or '.join(map(str, allowed))}, not {fields.get(key)}"
                    )
            reads = longest_read(variant.arch, variant.objective, seq_len, params)
            if reads > max_len:
                raise ValueError(
                    f"models.{name}.max_len ({max_len}) is shorter than the {reads} tokens arch "
                    f"'{variant.arch}' reads of a row of objective '{variant.objective}' at {key} {seq_len}"
                )
        return self
