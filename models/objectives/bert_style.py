"""T5's "BERT-style" objective (its Table 4, "predict all"): the noise of a row (i.i.d. tokens, as T5
drew it, or spans) becomes [MASK], a random token or stays itself (BERT's 80/10/10); the targets are the
whole original row. With `mask_fraction` 1 and `random_fraction` 0 it is T5's "MASS-style" row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from models.objectives.base import Args, Objective, ObjectiveParams, Pair
from models.objectives.noise import NoiseMask, check_replacement_split, mask_or_random, noise_mask
from models.special import SPECIAL

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor


@dataclass(frozen=True)
class BertStyleParams(ObjectiveParams):
    noise_density: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mask_fraction: float = field(default=0.8, metadata={"ge": 0.0, "le": 1.0})
    random_fraction: float = field(default=0.1, metadata={"ge": 0.0, "le": 1.0})
    noise_mask: NoiseMask = field(
        default="iid", metadata={"description": "iid: T5's objective tables; random_spans: spans"}
    )
    mean_span_length: float = field(
        default=3.0, metadata={"ge": 1.0, "description": "random_spans: the mean noise span"}
    )

    def check(self) -> None:
        check_replacement_split(self.mask_fraction, self.random_fraction)


class BertStyle(Objective):
    name, kind, Params = "bert_style", "sequence", BertStyleParams

    def row_length(self, seq_len: int, args: Args) -> int:
        return seq_len - 1  # and EOS

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        import torch

        kind, density, mean = args["noise_mask"], args["noise_density"], args["mean_span_length"]
        noise = torch.stack([noise_mask(kind, rows.shape[1], density, mean, generator) for _ in rows])
        split = args["mask_fraction"], args["random_fraction"]
        inputs = mask_or_random(rows, noise, *split, vocab_size, generator)
        eos = rows.new_full((len(rows), 1), SPECIAL.eos)
        return Pair(torch.cat([inputs, eos], dim=1), torch.cat([rows, eos], dim=1))

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        return seq_len, seq_len, seq_len


OBJECTIVE = BertStyle()
