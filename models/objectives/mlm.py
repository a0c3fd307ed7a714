"""BERT's masked LM: select non-special tokens at `mask_rate`; of those `mask_fraction` become [MASK],
`random_fraction` a random token, the rest are kept; the loss is on the selected tokens only. Whole
words or SpanBERT's spans, and its boundary objective, are options (models/objectives/spanbert.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from models.config import ModelConfig
from models.objectives import spanbert
from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces
from models.objectives.noise import bert_replacement
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.mlm import OBJECTIVE as DECLARED
from models.specs.objectives.mlm import MLMParams


@dataclass
class MaskedBatch:
    input_ids: Tensor  # [B, T] with the selected tokens replaced
    selected: Tensor  # [B, T] bool: the selected tokens
    positions: Tensor  # [N] flat indices into B*T of the selected tokens, ascending
    labels: Tensor  # [N] the original tokens there


def mask_tokens(
    tokens: Tensor,
    generator: torch.Generator,
    vocab_size: int,
    rate: float = 0.15,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> MaskedBatch:
    """BERT's selection and 80/10/10 replacement (the shares checked with the params:
    `objectives.mlm`, `MLMParams`)."""
    if vocab_size <= SPECIAL.n_special:
        raise ValueError(f"vocab_size ({vocab_size}) must exceed the {SPECIAL.n_special} special ids")
    flat = tokens.reshape(-1)
    selected = (torch.rand(flat.shape, generator=generator) < rate) & (flat >= SPECIAL.n_special)
    positions = selected.nonzero().squeeze(1)
    labels = flat[positions]
    choice = torch.rand(positions.shape, generator=generator)
    random_ids = torch.randint(SPECIAL.n_special, vocab_size, positions.shape, generator=generator)
    replaced = bert_replacement(labels, choice, random_ids, mask_fraction, random_fraction)
    inputs = flat.clone()
    inputs[positions] = replaced
    return MaskedBatch(inputs.view_as(tokens), selected.view_as(tokens), positions, labels)


class MaskedLM(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: MLMParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        split = params.mask_rate, params.mask_fraction, params.random_fraction
        if params.mask_unit != "token":
            lengths = spanbert.span_lengths(params)
            spans = spanbert.mask_spans(
                rows, pieces["word_starts"], generator, vocab_size, split[0], lengths, *split[1:]
            )
            extras = {
                "span_left": spans.span_left,
                "span_right": spans.span_right,
                "span_offset": spans.span_offset,
            }
            return Pair(spans.input_ids, rows, noise=spans.selected, extras=extras)
        masked = mask_tokens(rows, generator, vocab_size, *split)
        return Pair(masked.input_ids, rows, noise=masked.selected)

    def head(self, model: ModelConfig, params: MLMParams) -> nn.Module | None:
        return spanbert.boundary_head(model) if DECLARED.has_head(params) else None

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, params: MLMParams) -> int | None:
        if not params.boundary_loss:
            return None
        return spanbert.boundary_head_flops(model, round(DECLARED.widths(seq_len, params)[2] * batch_size))

    def example_extras(self, batch: dict[str, Tensor], params: MLMParams) -> dict[str, Tensor]:
        return spanbert.example_extras(len(batch["labels"])) if params.boundary_loss else {}


IMPLEMENTATION = MaskedLM()
