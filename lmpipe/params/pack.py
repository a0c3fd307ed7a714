"""The `pack` section: token ids in fixed-length rows, the validation split, and the sources' mix."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from lmpipe.params.schema import SourceName, Strict


class PackParams(Strict):
    val_fraction: float = Field(0.05, gt=0.0, lt=1.0)
    threads: int = Field(0, ge=0, description="0 = all cores")
    batch_documents: int = Field(128, ge=1, description="documents per encode task")
    sentences: bool = Field(
        False,
        description="split each document into sentences (paragraph breaks, then blingfire's rules) and "
        "encode it sentence by sentence, writing where documents and sentences start beside the tokens "
        "(<split>.documents.bin, <split>.sentences.bin): what pretrain.input_format's formats but "
        "full_sentences read",
    )
    repeat: dict[SourceName, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="an ingest source's copies in the training tokens (upsampling it in the mix); "
        "its validation documents stay once",
    )
