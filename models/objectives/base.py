"""What a pretraining objective is, and the random stream its batches draw from.

As in T5's own code, an objective only makes `(inputs, targets)` from a batch of rows of tokens; the
architecture's feature converter (models/architectures) turns that pair into its batch. So any
objective trains any architecture whose converter can express the pair's kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args, get_origin, get_type_hints

from models.pair import Pair, PairKind

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor

Args = Mapping[str, Any]  # params.yaml `objectives.<name>`


@dataclass(frozen=True)
class ObjectiveParams:
    """An objective's section of params.yaml (`objectives.<name>`): its fields, their bounds and
    description in each field's metadata (lmpipe/params/pretrain.py builds the schema from them, as
    lmpipe/params/models.py does from models/config.py; models/ needs no pydantic)."""

    def check(self) -> None:
        """Rules across fields: a ValueError says which is broken."""

    def validate(self) -> None:
        """Each field within its metadata's bounds and, if a Literal, one of its values (what the
        params schema checks, for params given elsewhere: a mixture's components)."""
        hints = get_type_hints(type(self))
        for spec in fields(self):
            value, bounds = getattr(self, spec.name), spec.metadata
            if get_origin(hints[spec.name]) is Literal and value not in get_args(hints[spec.name]):
                raise ValueError(
                    f"{spec.name}: {value!r} is not one of {', '.join(get_args(hints[spec.name]))}"
                )
            broken = [
                f"{word} {bounds[key]}"
                for key, word, holds in (
                    ("gt", ">", lambda v, b: v > b),
                    ("ge", ">=", lambda v, b: v >= b),
                    ("lt", "<", lambda v, b: v < b),
                    ("le", "<=", lambda v, b: v <= b),
                )
                if key in bounds and not holds(value, bounds[key])
            ]
            if broken:
                raise ValueError(f"{spec.name}: {value!r} must be {' and '.join(broken)}")


class Objective(ABC):
    """A pretraining objective: the tokens a row reads, the pair it makes of rows, and the widths of
    that pair (what the FLOPs count needs)."""

    name: ClassVar[str]
    kind: ClassVar[PairKind | None]  # None: a mixture, its components' kinds
    Params: ClassVar[type[ObjectiveParams]] = ObjectiveParams

    def components(self, args: Args) -> list[tuple[float, Objective, Args]]:
        """(share, objective, its args) of what makes a batch: this objective, or a mixture's parts."""
        return [(1.0, self, args)]

    def static_copies(self, args: Args) -> int | None:
        """With static masking (BERT's `dupe_factor`), the copies of the data: every row's noise drawn
        once per copy and reused whenever that copy is read; None: fresh noise every batch (dynamic)."""
        return None

    def row_length(self, seq_len: int, args: Args) -> int:
        """Tokens read per row for inputs of `seq_len`."""
        return seq_len

    @abstractmethod
    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair: ...

    @abstractmethod
    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        """(inputs width, targets width, predicted tokens per row): exact for fixed-width pairs, the
        expectation where rows differ."""

    def longest(self, seq_len: int, args: Args) -> list[tuple[int, int]]:
        """The widest (inputs, targets) a row can make, what the model's max_len must hold (bounds, or
        the extremes where one grows as the other shrinks)."""
        inputs, targets, _ = self.widths(seq_len, args)
        return [(inputs, targets)]


def batch_generator(seed: int, index: int) -> torch.Generator:
    """The RNG of one micro-batch by its index across processes (micro-step × processes + rank): the
    same masks whichever DataLoader worker builds it (any number of workers, a resume at any step), and
    W processes see the micro-batches that one process accumulating W of them would."""
    import torch

    from models.training import derived_seed  # it imports torch

    return torch.Generator().manual_seed(derived_seed(seed, index))
