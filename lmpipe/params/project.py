"""The whole of params.yaml, every section and every rule across them: what the flows and profiles
validate before a run starts, and every stage before it reads its own sections, so that a mistake
anywhere in the file stops the first stage that runs. That check can stop a stage but never change
what it writes: lmpipe.codedeps counts this module as output-neutral, and a stage depends on the
sections it reads alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ConfigDict, model_validator

from lmpipe.params.clean import CleanParams
from lmpipe.params.cluster import ClusterParams
from lmpipe.params.finetune import FinetuneSections
from lmpipe.params.hub import HubParams
from lmpipe.params.ingest import IngestParams
from lmpipe.params.pack import PackParams
from lmpipe.params.pretrain import PretrainSections
from lmpipe.params.sample import SampleParams
from lmpipe.params.schema import PARAMS_FILE, S, SourceName, load_sections, parse
from lmpipe.params.tokenizer import TokenizerParams
from lmpipe.tracking import TrackingParams


class Params(PretrainSections, FinetuneSections):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tracking: TrackingParams = TrackingParams()
    sample: SampleParams = SampleParams()
    cluster: ClusterParams = ClusterParams()
    hub: dict[SourceName, HubParams] = {}
    ingest: IngestParams
    clean: CleanParams = CleanParams()
    tokenizer: TokenizerParams = TokenizerParams()
    pack: PackParams = PackParams()

    @model_validator(mode="after")
    def _repeated_sources_are_ingested(self) -> Params:
        for source in self.pack.repeat:
            if source not in self.ingest.sources:
                raise ValueError(
                    f"pack.repeat.{source}: no ingest source '{source}' "
                    f"(ingest.sources: {', '.join(self.ingest.sources)})"
                )
        return self

    @model_validator(mode="after")
    def _formats_have_their_index(self) -> Params:
        for name in self.models:
            fmt = self.pretrain_of(name).input_format
            if fmt != "full_sentences" and not self.pack.sentences:
                raise ValueError(
                    f"{self.pretrain_key(name, 'input_format')}: {fmt} reads where sentences start: "
                    "set pack.sentences: true"
                )
        return self


def parse_params(raw: Any, origin: str = str(PARAMS_FILE)) -> Params:
    return parse(Params, raw, origin)


def load_params(path: Path = PARAMS_FILE) -> Params:
    return load_sections(Params, path)


def load_stage_params(sections: type[S], path: Path = PARAMS_FILE) -> S:
    """A stage's own sections of params.yaml, once the whole file is valid."""
    load_params(path)
    return load_sections(sections, path)
