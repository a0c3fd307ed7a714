"""T5's prefix LM objective ("LM" in its Table 2): each row split at a random point, the prefix the
inputs, the continuation the targets (T5's random_prefix_noise_mask: the inputs take between
round((1 - 2·noise_density)·(L - 1)) and L - 1 tokens, uniformly; noise_density 0.5: 1 to L - 1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from models.objectives.base import Args, Objective, ObjectiveParams, Pair
from models.special import SPECIAL

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


def prefix_bounds(length: int, noise_density: float) -> tuple[int, int]:
    """The fewest and most input tokens of a row of `length` (T5's random_prefix_noise_mask)."""
    most = length - 1
    return min(most, max(1, round((1 - 2 * noise_density) * most))), most


def split_rows(rows: Tensor, input_lengths: Tensor) -> Pair:
    """Each row's first `input_lengths[b]` tokens as inputs, the rest as targets, both right-padded."""
    import torch

    length = rows.shape[1]
    column = torch.arange(length)[None, :]
    target_lengths = length - input_lengths
    inputs = torch.where(column < input_lengths[:, None], rows, SPECIAL.pad)
    shifted = rows.gather(1, (column + input_lengths[:, None]).clamp(max=length - 1))
    targets = torch.where(column < target_lengths[:, None], shifted, SPECIAL.pad)
    return Pair(
        inputs[:, : int(input_lengths.max())],
        targets[:, : int(target_lengths.max())],
        input_lengths,
        target_lengths,
    )


@dataclass(frozen=True)
class LMParams(ObjectiveParams):
    noise_density: float = field(
        default=0.5,
        metadata={"gt": 0.0, "lt": 1.0, "description": "the expected fraction of a row that is targets"},
    )


class PrefixLMObjective(Objective):
    name, kind, Params = "lm", "sequence", LMParams

    def row_length(self, seq_len: int, args: Args) -> int:
        return seq_len + 1  # a decoder-only model reads seq_len of them, as with clm

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        import torch

        fewest, most = prefix_bounds(rows.shape[1], args["noise_density"])
        return split_rows(rows, torch.randint(fewest, most + 1, (len(rows),), generator=generator))

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        fewest, most = prefix_bounds(seq_len + 1, args["noise_density"])
        inputs = (fewest + most) / 2
        return round(inputs), seq_len + 1 - round(inputs), seq_len + 1 - inputs

    def longest(self, seq_len: int, args: Args) -> list[tuple[int, int]]:
        fewest, most = prefix_bounds(seq_len + 1, args["noise_density"])
        return [(most, seq_len + 1 - most), (fewest, seq_len + 1 - fewest)]


OBJECTIVE = PrefixLMObjective()
