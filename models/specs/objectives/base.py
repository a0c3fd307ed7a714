"""What an objective declares: its params with their bounds, the pair kind it makes, the tokens a row
reads and the widths of its pair, the data it needs, and where its implementation is. No torch: every
stage imports the declarations when it validates params.yaml (models/objectives/base.py: what an
implementation computes)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from models.pair import PairKind


@dataclass(frozen=True)
class ObjectiveParams:
    """An objective's section of params.yaml (`objectives.<name>`): its fields, their bounds and
    description in each field's metadata (lmpipe/params/pretrain.py builds the schema from them, as
    lmpipe/params/models.py does from models/config.py; models/ needs no pydantic)."""

    def check(self) -> None:
        """Rules across fields: a ValueError says which is broken."""


def check_replacement_split(mask_fraction: float, random_fraction: float) -> None:
    """BERT's replacement shares (models/objectives/noise.py: `bert_replacement`) leave the kept one >= 0."""
    if mask_fraction + random_fraction > 1.0:
        raise ValueError("mask_fraction + random_fraction must be <= 1 (the rest is kept unchanged)")


class ObjectiveSpec(ABC):
    """A pretraining objective's declaration: the tokens a row reads, the kind and widths of the pair it
    makes of rows (what the params check and the FLOPs count need), and its implementation's module
    (`pair`, and a head where it trains one), loaded only where it runs."""

    name: ClassVar[str]
    kind: ClassVar[PairKind | None]  # None: a mixture, its components' kinds
    Params: ClassVar[type[ObjectiveParams]] = ObjectiveParams
    implementation: ClassVar[str | None]  # its module's `IMPLEMENTATION`; None: a mixture's are its parts'
    trains_lm_head: ClassVar[bool] = True  # the model's tied LM head: what its export's LM class runs
    pair_formats: ClassVar[bool] = False  # trains RoBERTa's pair formats (pretrain.input_format)

    def components(self, params: ObjectiveParams) -> list[tuple[float, ObjectiveSpec, ObjectiveParams]]:
        """(share, objective, its params) of what makes a batch: this objective, or a mixture's parts."""
        return [(1.0, self, params)]

    def static_copies(self, params: ObjectiveParams) -> int | None:
        """With static masking (BERT's `dupe_factor`), the copies of the data: every row's noise drawn
        once per copy and reused whenever that copy is read; None: fresh noise every batch (dynamic)."""
        return None

    def row_length(self, seq_len: int, params: ObjectiveParams) -> int:
        """Tokens read per row for inputs of `seq_len`."""
        return seq_len

    def has_head(self, params: ObjectiveParams) -> bool:
        """Whether its implementation trains a head of its own beside the model (ELECTRA's generator and
        discriminator head) in place of the model's tied LM head."""
        return False

    def head_takes_memory(self, params: ObjectiveParams) -> bool:
        """Whether its head runs the model over Transformer-XL's memory (`recur`: XLNet's two streams),
        so that the model may have one (`models.<name>.mem_len`)."""
        return False

    def reversed_rows(self, params: ObjectiveParams, batch_size: int) -> int:
        """The last rows of a batch that read their text backward (XLNet's bidirectional data): the data
        reads their streams from the end, and the pair reverses them."""
        return 0

    def model_needs(self, params: ObjectiveParams) -> dict[str, Any]:
        """The values of `models.<name>` fields its implementation needs (XLNet's two-stream attention:
        an encoder with relative attention), each a value or a tuple of the values allowed, beyond the
        pair kinds an architecture takes."""
        return {}

    def piece_tables(self, params: ObjectiveParams) -> tuple[str, ...]:
        """The tokenizer's piece tables that its pairs read by name (models/pieces.py: `word_starts`,
        `sentence_ends`), which `make_batch` hands its implementation's `pair`."""
        return ()

    @abstractmethod
    def widths(self, seq_len: int, params: ObjectiveParams) -> tuple[int, int, float]:
        """(inputs width, targets width, predicted tokens per row): exact for fixed-width pairs, the
        expectation where rows differ."""

    def longest(self, seq_len: int, params: ObjectiveParams) -> list[tuple[int, int]]:
        """The widest (inputs, targets) a row can make, what the model's max_len must hold (bounds, or
        the extremes where one grows as the other shrinks)."""
        inputs, targets, _ = self.widths(seq_len, params)
        return [(inputs, targets)]


OBJECTIVES: dict[str, ObjectiveSpec] = {}  # by name: models/specs/objectives/__init__.py imports them all


def register(objective: ObjectiveSpec) -> ObjectiveSpec:
    """Add an objective to the registry (what its declaration module does as it is imported):
    `models.<name>.objective` may name it, `objectives.<name>` holds its params."""
    OBJECTIVES[objective.name] = objective
    return objective
