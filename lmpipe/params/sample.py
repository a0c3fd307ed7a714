"""The `sample` section: the synthetic corpus and GLUE tasks of the offline default profile."""

from __future__ import annotations

from pydantic import Field, model_validator

from lmpipe.params.schema import Strict


class SampleParams(Strict):
    """The synthetic corpus of the offline default profile."""

    documents: int = Field(800, ge=1, le=1_000_000)
    min_sentences: int = Field(5, ge=1)
    max_sentences: int = Field(14, ge=1)
    files: int = Field(4, ge=1, le=1000)
    lexicon_size: int = Field(500, ge=20, le=100_000)
    glue_train_rows: int = Field(400, ge=1, description="rows per synthetic GLUE task and split")
    glue_dev_rows: int = Field(1000, ge=1)

    @model_validator(mode="after")
    def _sentence_range(self) -> SampleParams:
        if self.min_sentences > self.max_sentences:
            raise ValueError(
                f"min_sentences ({self.min_sentences}) must be <= max_sentences ({self.max_sentences})"
            )
        return self
