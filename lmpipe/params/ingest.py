"""The `ingest` section: the corpus sources, one stage `ingest@<name>` each."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from lmpipe.params.schema import InputPath, SourceName, Strict


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


class IngestParams(Strict):
    """`sources`: name -> source; each is its own stage `ingest@<name>` writing `data/raw/<name>`."""

    sources: dict[SourceName, SourceParams] = Field(min_length=1)
    encoding_errors: Literal["replace", "skip", "fail"] = "replace"
    on_malformed: Literal["fail", "skip"] = "fail"
    workers: int = Field(0, ge=0, description="processes reading a folder's files; 0 = all cores")
