"""SpanBERT's masking and span-boundary objective (Joshi et al., 2020), options of the masked LM
(`objectives.mlm.mask_unit`, `boundary_loss`), as facebookresearch/SpanBERT does them: spans of whole
words (SentencePiece's word-start marks say where words begin) from a random word on, their lengths in
words drawn from a geometric distribution (p 0.2, clipped at 10: mean 3.8), until 15 % of the row's
tokens are masked; each span as a whole [MASK], random tokens or kept (80/10/10); a span starts
inside the row and ends before its last token, so that both its boundary tokens exist. The boundary
objective predicts each masked token from the states of the two tokens around its span and its
offset in the span (a two-layer GELU and LayerNorm network), through the tied LM head."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import ModelConfig
from models.objectives.base import Terms
from models.special import SPECIAL, SpecialIds
from models.specs.objectives.mlm import MLMParams
from models.stack_flops import lm_head_weights
from models.transformer import Transformer, init_normal


@dataclass
class SpanMasked:
    input_ids: Tensor  # [B, T], the spans replaced
    selected: Tensor  # [B, T] bool
    # per selected token, in flat order: flat indices of the tokens before and after its span, and its
    # offset in the span (what the boundary objective reads)
    span_left: Tensor
    span_right: Tensor
    span_offset: Tensor


def geometric_lengths(p: float, longest: int) -> list[float]:
    """SpanBERT's span lengths in words: P(k) ∝ p(1−p)^(k−1), k = 1 … longest."""
    weights = [p * (1 - p) ** (k - 1) for k in range(1, longest + 1)]
    return [w / sum(weights) for w in weights]


def word_starts_of(tokens: Tensor, table: Tensor, special: SpecialIds = SPECIAL) -> np.ndarray:
    """[B, T] bool: where a word begins, by the tokenizer's table of word-start pieces; a special token
    is a word of its own, and so the token after it starts one."""
    ids = tokens.numpy()
    starts = table.numpy()[ids] | (ids < special.n_special)
    starts[:, 0] = True
    starts[:, 1:] |= ids[:, :-1] < special.n_special
    return starts


def mask_spans(
    tokens: Tensor,
    word_table: Tensor,
    generator: torch.Generator,
    vocab_size: int,
    rate: float,
    lengths: list[float],
    mask_fraction: float,
    random_fraction: float,
    special: SpecialIds = SPECIAL,
) -> SpanMasked:
    """Whole-word spans of lengths drawn from `lengths` (P of 1, 2, … words) until `rate` of each row's
    tokens are selected (the last span cut at the budget, as SpanBERT's); an anchor word already in a
    span is drawn again, and a span runs over words already masked (they count once), as SpanBERT's
    loop does: a token keeps the last span's boundaries."""
    batch, width = tokens.shape
    starts = word_starts_of(tokens, word_table, special)
    inputs = tokens.clone()
    selected = np.zeros((batch, width), dtype=bool)
    left, right, offset = (np.zeros((batch, width), dtype=np.int64) for _ in range(3))
    weights = torch.tensor(lengths)
    for b in range(batch):
        bounds = [*np.flatnonzero(starts[b]).tolist(), width]
        words = list(zip(bounds[:-1], bounds[1:], strict=True))  # [first, end) of each word
        eligible = [
            j
            for j, (f, e) in enumerate(words)
            if f >= 1 and e <= width - 1 and tokens[b, f] >= special.n_special
        ]
        usable = set(eligible)
        budget = max(1, round(rate * width))
        masked = 0
        for _ in range(4 * len(words)):  # bounded: a row of few eligible words stops short of its budget
            if masked >= budget or not eligible:
                break
            n_words = int(torch.multinomial(weights, 1, generator=generator)) + 1
            anchor = eligible[int(torch.randint(len(eligible), (1,), generator=generator))]
            if selected[b, words[anchor][0]]:
                continue
            first, last = words[anchor][0], None
            for w in range(anchor, anchor + n_words):  # over words already masked, as SpanBERT's loop
                if w not in usable or masked >= budget:
                    break
                for t in range(*words[w]):
                    if masked >= budget:
                        break
                    masked += not selected[b, t]
                    selected[b, t], last = True, t
            choice = float(torch.rand(1, generator=generator))
            span = slice(first, last + 1)
            if choice < mask_fraction:
                inputs[b, span] = special.mask
            elif choice < mask_fraction + random_fraction:
                size = (last + 1 - first,)
                inputs[b, span] = torch.randint(special.n_special, vocab_size, size, generator=generator)
            left[b, span], right[b, span] = b * width + first - 1, b * width + last + 1
            offset[b, span] = np.arange(last + 1 - first)
    flat = selected.reshape(-1)
    return SpanMasked(
        inputs,
        torch.from_numpy(selected),
        *(torch.from_numpy(a.reshape(-1)[flat]) for a in (left, right, offset)),
    )


def boundary_head(model: ModelConfig) -> nn.Module:
    """The masked LM's step with SpanBERT's boundary objective beside it: the module PretrainModule
    trains as the objective's head (models/objectives/base.py)."""

    d = model.d_model

    class BoundaryHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.offsets = torch.nn.Embedding(model.max_len, d)  # a token's position within its span
            self.layers = torch.nn.Sequential(
                torch.nn.Linear(3 * d, d),
                torch.nn.GELU(),
                torch.nn.LayerNorm(d, eps=model.norm_eps),
                torch.nn.Linear(d, d),
                torch.nn.GELU(),
                torch.nn.LayerNorm(d, eps=model.norm_eps),
            )
            self.apply(lambda module: init_normal(module, model.init_std))

        def forward(self, encoder: Transformer, batch: dict[str, Tensor]) -> Terms:
            hidden = encoder(
                batch["input_ids"], batch.get("pad_mask"), prefix_lengths=batch.get("prefix_lengths")
            )
            logits, labels = encoder.arch.logits_and_labels(encoder, batch, hidden)
            loss = F.cross_entropy(logits.float(), labels)
            flat = hidden.reshape(-1, d)
            around = [flat.index_select(0, batch["span_left"]), flat.index_select(0, batch["span_right"])]
            states = self.layers(torch.cat([*around, self.offsets(batch["span_offset"])], dim=-1))
            boundary = encoder.lm_logits(states)
            boundary_loss = F.cross_entropy(boundary.float(), labels)
            accuracy = (boundary.argmax(-1) == labels).float().mean()
            correct = (logits.argmax(-1) == labels).sum()
            return Terms(
                loss, correct, labels.numel(), {"boundary": (boundary_loss, 1.0)}, {"boundary": accuracy}
            )

    return BoundaryHead()


def boundary_head_flops(model: ModelConfig, predicted: int) -> int:
    """Forward FLOPs of the masked LM's head and the boundary objective's on `predicted` tokens: the
    tied LM head twice and the two-layer network."""
    d = model.d_model
    lm_head = lm_head_weights(d, model.embedding_size, model.vocab_size, model.lm_head == "transform")
    return 2 * predicted * (2 * lm_head + 3 * d * d + d * d)


def example_extras(predicted: int) -> dict[str, Tensor]:
    return {
        key: torch.zeros(predicted, dtype=torch.long, device="meta")
        for key in ("span_left", "span_right", "span_offset")
    }


def span_lengths(params: MLMParams) -> list[float]:
    """The distribution of a span's length in words for `mask_unit`: whole words one word each, spans
    SpanBERT's clipped geometric."""
    return [1.0] if params.mask_unit == "word" else geometric_lengths(params.span_p, params.max_span)
