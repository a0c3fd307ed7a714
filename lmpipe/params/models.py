"""The `models` section: named variants of the model code's presets."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any, Literal, get_type_hints

from pydantic import Field, create_model, model_validator

from lmpipe.params.schema import Sections, Strict
from lmpipe.runtime import StageError
from models.config import OBJECTIVE_OF_ARCH, PRESETS, Arch, ModelConfig, Objective

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

    arch: Arch
    objective: Objective
    preset: Literal[tuple(PRESETS)] = "tiny"  # type: ignore[valid-type]
    # here, not in the `pretrain` section, so that `pretrain@<other>` (which depends on `pretrain`) is
    # not made stale by this model's budget; checked against the pretrain keys by PretrainSections
    pretrain: dict[str, Any] = Field(
        {}, description="this model's own values of `pretrain` keys (e.g. a step budget)"
    )

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
        overrides = self.model_dump(exclude={"arch", "objective", "preset", "pretrain"}, exclude_none=True)
        return {**PRESETS[self.preset], **overrides}

    def config(self, vocab_size: int = ModelConfig.vocab_size) -> ModelConfig:
        """The model code's config of this variant (its own rules checked: a ValueError says which)."""
        return ModelConfig(arch=self.arch, vocab_size=vocab_size, **self.config_fields())


class ModelsSections(Sections):
    """The sections of a stage that takes a model's name."""

    models: dict[str, ModelParams] = {}

    @model_validator(mode="after")
    def _model_names(self) -> ModelsSections:
        for name in self.models:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"models.{name}: model names may use letters, digits, '_' and '-'")
        for name, variant in self.models.items():
            try:  # the model's own rules (head sizes, layers per arch), before any stage starts
                variant.config()
            except ValueError as exc:
                raise ValueError(f"models.{name}: {exc}") from None
        return self

    def check_model(self, name: str) -> None:
        """A stage's `<model>` argument names a variant of `models`, or one line says which there are."""
        if name not in self.models:
            known = ", ".join(self.models) or "(none)"
            raise StageError(f"params.yaml: models.{name}: no such model; the models are: {known}")
