"""BERT's masked LM: select non-special tokens at `mask_rate`; of those `mask_fraction` become [MASK],
`random_fraction` a random token, the rest are kept; the loss is on the selected tokens only. Whole
words or SpanBERT's spans, and its boundary objective, are options (models/objectives/spanbert.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from models.objectives import spanbert
from models.objectives.base import Args, Objective, ObjectiveParams, Pair
from models.objectives.noise import bert_replacement, check_replacement_split
from models.special import SPECIAL

# torch is imported where it is used: every stage, the data stages too, imports this module
# when it validates params.yaml
if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from models.config import ModelConfig


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
    import torch

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


@dataclass(frozen=True)
class MLMParams(ObjectiveParams):
    mask_rate: float = field(default=0.15, metadata={"gt": 0.0, "lt": 1.0})
    mask_fraction: float = field(default=0.8, metadata={"ge": 0.0, "le": 1.0})
    random_fraction: float = field(default=0.1, metadata={"ge": 0.0, "le": 1.0})
    masking: Literal["dynamic", "static"] = field(
        default="dynamic",
        metadata={
            "description": "dynamic: fresh masks every time a row is read (RoBERTa); static: each row's "
            "masks fixed per copy of the data (BERT's dupe_factor), the copies read in turn, epoch by "
            "epoch (needs pretrain.sampling: epoch)"
        },
    )
    copies: int = field(default=10, metadata={"ge": 1, "description": "static masking's copies (BERT: 10)"})
    mask_unit: Literal["token", "word", "span"] = field(
        default="token",
        metadata={
            "description": "token: BERT's; word: whole words; span: SpanBERT's spans of whole words, "
            "geometric lengths (span_p, max_span); each word or span masked, replaced or kept as a whole"
        },
    )
    span_p: float = field(
        default=0.2, metadata={"gt": 0.0, "le": 1.0, "description": "span: the geometric p"}
    )
    max_span: int = field(default=10, metadata={"ge": 1, "description": "span: the longest span, in words"})
    boundary_loss: bool = field(
        default=False,
        metadata={
            "description": "SpanBERT's span-boundary objective beside the masked LM: each masked token "
            "predicted from the tokens around its span and its offset (mask_unit word or span)"
        },
    )
    pair_loss: Literal["nsp", "sop", "none"] = field(
        default="nsp",
        metadata={
            "description": "on a pair format's [CLS] (pretrain.input_format segment_pair, sentence_pair): "
            "BERT's next-sentence prediction, ALBERT's sentence-order prediction, or none; the other "
            "formats have no pairs and no such loss"
        },
    )

    def check(self) -> None:
        check_replacement_split(self.mask_fraction, self.random_fraction)
        if self.boundary_loss and self.mask_unit == "token":
            raise ValueError("boundary_loss: the span-boundary objective needs spans: mask_unit word or span")
        if self.boundary_loss and self.masking == "static":  # static rows are stacked one by one
            raise ValueError("boundary_loss: the span-boundary objective takes masking: dynamic")


class MaskedLM(Objective):
    name, kind, Params = "mlm", "aligned", MLMParams

    def pair(self, rows: Tensor, args: Args, generator: torch.Generator, vocab_size: int) -> Pair:
        split = args["mask_rate"], args["mask_fraction"], args["random_fraction"]
        if args["mask_unit"] != "token":
            lengths = spanbert.span_lengths(args)
            spans = spanbert.mask_spans(
                rows, args["word_starts"], generator, vocab_size, split[0], lengths, *split[1:]
            )
            extras = {
                "span_left": spans.span_left,
                "span_right": spans.span_right,
                "span_offset": spans.span_offset,
            }
            return Pair(spans.input_ids, rows, noise=spans.selected, extras=extras)
        masked = mask_tokens(rows, generator, vocab_size, *split)
        return Pair(masked.input_ids, rows, noise=masked.selected)

    def piece_tables(self, args: Args) -> tuple[str, ...]:
        return ("word_starts",) if args["mask_unit"] != "token" else ()

    def has_head(self, args: Args) -> bool:
        return args["boundary_loss"]

    def head(self, model: ModelConfig, args: Args) -> nn.Module | None:
        return spanbert.boundary_head(model) if self.has_head(args) else None

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, args: Args) -> int | None:
        if not args["boundary_loss"]:
            return None
        return spanbert.boundary_head_flops(model, round(self.widths(seq_len, args)[2] * batch_size))

    def example_extras(self, predicted: int, args: Args) -> dict[str, Tensor]:
        return spanbert.example_extras(predicted) if args["boundary_loss"] else {}

    def static_copies(self, args: Args) -> int | None:
        return args["copies"] if args["masking"] == "static" else None

    def widths(self, seq_len: int, args: Args) -> tuple[int, int, float]:
        return seq_len, seq_len, args["mask_rate"] * seq_len  # the expected selection


OBJECTIVE = MaskedLM()
