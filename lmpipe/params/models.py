"""The `models` section: named variants of the model code's presets."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any, Literal, get_type_hints

from pydantic import Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

from lmpipe.params.distill import DistillParams, StudentParams, student_entry
from lmpipe.params.schema import Sections, Strict, _problems
from lmpipe.runtime import StageError
from models.config import PRESETS, ModelConfig
from models.specs.architectures import ARCHITECTURES
from models.specs.objectives import OBJECTIVES

# a variant may override every field of the model config but the architecture (its own key) and what
# the tokenizer decides (the vocabulary, the padding id): their types and bounds are the config's own
_CONFIG_TYPES = get_type_hints(ModelConfig)
_Overrides = create_model(
    "_Overrides",
    __base__=Strict,
    **{
        f.name: (_CONFIG_TYPES[f.name] | None, Field(None, **f.metadata))
        for f in fields(ModelConfig)
        if f.name not in ("arch", "vocab_size", "pad_id")
    },
)


class ModelParams(_Overrides):
    """A named model variant: architecture, objective, a size preset and any overrides of it."""

    arch: str = Field(description=f"models/specs/architectures' registry: {', '.join(ARCHITECTURES)}")
    objective: str = Field(description=f"models/specs/objectives' registry: {', '.join(OBJECTIVES)}")
    preset: Literal[tuple(PRESETS)] = "tiny"  # type: ignore[valid-type]
    # here, not in the `pretrain` section, so that `pretrain@<other>` (which depends on `pretrain`) is
    # not made stale by this model's budget; checked against the pretrain keys by PretrainSections
    pretrain: dict[str, Any] = Field(
        {}, description="this model's own values of `pretrain` keys (e.g. a step budget)"
    )

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str) -> str:
        if arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture '{arch}' (one of: {', '.join(ARCHITECTURES)})")
        return arch

    @field_validator("objective")
    @classmethod
    def _objective_fits_arch(cls, objective: str, info: ValidationInfo) -> str:
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective '{objective}' (one of: {', '.join(OBJECTIVES)})")
        if "arch" not in info.data:  # an unknown architecture: said on its own key
            return objective
        arch, kind = ARCHITECTURES[info.data["arch"]], OBJECTIVES[objective].kind
        if kind is not None and kind not in arch.fits:  # a mixture's parts: checked with its params
            fitting = [name for name, other in OBJECTIVES.items() if other.kind in arch.fits]
            raise ValueError(
                f"does not fit arch '{arch.name}', whose converter takes {' or '.join(sorted(arch.fits))} "
                f"pairs ('{objective}' makes {kind} ones; these fit: {', '.join(fitting)})"
            )
        return objective

    def config_fields(self) -> dict[str, Any]:
        """Preset values overridden by what this variant sets."""
        overrides = self.model_dump(exclude={"arch", "objective", "preset", "pretrain"}, exclude_none=True)
        return {**PRESETS[self.preset], **overrides}

    def config(self, vocab_size: int = ModelConfig.vocab_size) -> ModelConfig:
        """The model code's config of this variant (its own rules checked: a ValueError says which)."""
        return ModelConfig(arch=self.arch, vocab_size=vocab_size, **self.config_fields())


class ModelsSections(Sections):
    """The sections of a stage that takes a model's name. A student of `distill.students` is a model too:
    its teacher's entry with its own layers and budget (`student_entry`), so that it fine-tunes, exports
    and is reported as any model is; stage `distill@<student>` trains it, not `pretrain@`."""

    models: dict[str, ModelParams] = {}
    distill: DistillParams = DistillParams()

    @model_validator(mode="before")
    @classmethod
    def _students_are_models(cls, raw: Any) -> Any:
        distill = raw.get("distill") if isinstance(raw, dict) else None
        students = distill.get("students") if isinstance(distill, dict) else None
        if not isinstance(students, dict) or not students:
            return raw  # nothing to add, or a wrong shape said on its own key
        declared = raw.get("models") or {}
        models = dict(declared)
        for name, entry in students.items():
            try:
                student = StudentParams.model_validate(entry)
            except ValidationError as exc:
                raise ValueError(_problems(exc, f"distill.students.{name}")) from None
            if name in declared:
                raise ValueError(
                    f"distill.students.{name}: models.{name} exists; a student is a model of its own"
                )
            teacher = declared.get(student.teacher)
            if not isinstance(teacher, dict):
                known = ", ".join(declared) or "(none)"
                raise ValueError(
                    f"distill.students.{name}.teacher: no model '{student.teacher}' (the models: {known})"
                )
            try:
                teacher_layers = ModelParams.model_validate(teacher).config_fields()["n_layers"]
            except ValidationError:
                continue  # the teacher's own error is said on its own keys
            models[name] = student_entry(name, student, teacher, teacher_layers)
        return {**raw, "models": models}

    def model_key(self, name: str) -> str:
        """The dotted key of `name`'s own entry: `models.<name>`, or a student's in `distill.students`."""
        return f"distill.students.{name}" if name in self.distill.students else f"models.{name}"

    def student(self, name: str) -> StudentParams | None:
        """`name`'s entry of distill.students, if it is a student."""
        return self.distill.students.get(name)

    @model_validator(mode="after")
    def _model_names(self) -> ModelsSections:
        for name in self.models:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"models.{name}: model names may use letters, digits, '_' and '-'")
        for name, variant in self.models.items():
            try:  # the model's own rules (head sizes, layers per arch), before any stage starts
                variant.config()
            except ValueError as exc:  # "<field>: why" names its dotted key
                key, _, why = str(exc).partition(": ")
                dotted = (
                    f"models.{name}.{key}: {why}" if key in _CONFIG_TYPES and why else f"models.{name}: {exc}"
                )
                raise ValueError(dotted) from None
        return self

    def check_model(self, name: str) -> None:
        """A stage's `<model>` argument names a variant of `models`, or one line says which there are."""
        if name not in self.models:
            known = ", ".join(self.models) or "(none)"
            raise StageError(f"params.yaml: models.{name}: no such model; the models are: {known}")
