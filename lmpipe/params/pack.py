"""The `pack` section: token ids in fixed-length rows, and the validation split."""

from __future__ import annotations

from pydantic import Field

from lmpipe.params.schema import Strict


class PackParams(Strict):
    val_fraction: float = Field(0.05, gt=0.0, lt=1.0)
    threads: int = Field(0, ge=0, description="0 = all cores")
    batch_documents: int = Field(128, ge=1, description="documents per encode task")
