"""The `hub` section: Hugging Face Hub datasets pinned to a commit, one stage `hub@<name>` each."""

from __future__ import annotations

from pydantic import Field, model_validator

from lmpipe.params.schema import Strict


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
