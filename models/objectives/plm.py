"""XLNet's permutation language model (Yang et al., 2019): every row's tokens, none replaced by a [MASK],
are predicted in a random factorisation order, each from the tokens before it in that order.

- Partial prediction (§2.3): only the last seq_len // K tokens of the order are predicted. The others
  come first, in no order among themselves, and see each other; a predicted token sees them and the
  predicted tokens before it. With span-based prediction the predicted tokens are XLNet's n-grams:
  its code's `_sample_mask`, n from 1 to max_span with p ∝ 1/n, each at a random offset in a context
  of K·n tokens, starting at a word start (n pieces: its loop counts the span's first piece); the
  count filled up with single tokens. Specials are never predicted where a row has other tokens.
- Two-stream attention (§2.3, models/transformer.py: `Block.two_stream`): the content stream is the
  model's encoder under the order's content mask (a token sees itself); the query stream starts from
  a learned mask embedding at each predicted position and sees the content of the tokens before it in
  the order, never its own. The query stream's last states go through the model's tied LM head.
- Bidirectional data: the batch's last `reversed_rows` rows are reversed (their streams read backward
  by the data), with the distances' encodings negated for them, as its code's `bi_data`.
- Memory: with `models.<name>.mem_len` each layer's content stream also attends to the states that
  entered it over the previous segments of its lane (Transformer-XL's, as XLNet's `mems`).

The pair is aligned: the inputs are the tokens themselves, the targets too, `noise` the predicted
positions (exactly `predicted(seq_len)` a row, the batch's positions row by row), and `rank` [B, T]
each token's place in the order (0: the unpredicted context, 1 to P: the predicted tokens in order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import ModelConfig
from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces, Terms
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.plm import OBJECTIVE as DECLARED
from models.specs.objectives.plm import PLMParams
from models.stack_flops import lm_head_weights
from models.transformer import Transformer, next_memory


def span_targets(starts: Tensor, predicted: int, k: int, max_span: int, generator: torch.Generator) -> Tensor:
    """XLNet's `_sample_mask` over one row: [T] bool, at most `predicted` positions in spans, given
    which positions start a word (`starts`). The draws are made up front, one per possible span."""
    length = len(starts)
    weights = 1.0 / torch.arange(1, max_span + 1, dtype=torch.float64)
    sizes = (torch.multinomial(weights, predicted, replacement=True, generator=generator) + 1).tolist()
    offsets = torch.rand(predicted, generator=generator, dtype=torch.float64).tolist()
    is_start = starts.tolist()
    chosen = torch.zeros(length, dtype=torch.bool)
    count = cursor = 0
    for size, offset in zip(sizes, offsets, strict=True):
        if count >= predicted:
            break
        n = min(size, predicted - count)
        context = n * k
        left = int(offset * context)
        begin = cursor + left
        while begin < length and not is_start[begin]:
            begin += 1
        end = begin + n
        if end >= length:
            break
        chosen[begin:end] = True
        count += n
        cursor = end + context - left
    return chosen


def predicted_positions(
    rows: Tensor, params: PLMParams, generator: torch.Generator, word_starts: Tensor | None
) -> Tensor:
    """[B, T] bool: exactly `params.predicted(T)` positions a row (spans first where span-based, then
    single tokens at random, non-special ones first)."""
    b, length = rows.shape
    predicted = params.predicted(length)
    chosen = torch.zeros(b, length, dtype=torch.bool)
    special = rows < SPECIAL.n_special
    if params.span:
        for i in range(b):
            chosen[i] = span_targets(word_starts[rows[i]], predicted, params.k, params.max_span, generator)
        chosen &= ~special
    # the rest single tokens: a random key, the chosen first, then the non-special, then the specials
    keys = torch.rand(b, length, generator=generator) + 2 * special - 3 * chosen
    picked = keys.topk(predicted, dim=1, largest=False).indices
    return torch.zeros(b, length, dtype=torch.bool).scatter_(1, picked, True)


def factorisation_ranks(chosen: Tensor, generator: torch.Generator) -> Tensor:
    """[B, T]: 0 on the context, 1 to P on the predicted positions in a random order."""
    b, length = chosen.shape
    keys = torch.rand(b, length, generator=generator).masked_fill(~chosen, -1.0)
    order = keys.argsort(dim=1)  # the context first, then the predicted positions in random order
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(length).expand(b, length).contiguous())
    return (rank - (length - int(chosen[0].sum())) + 1).clamp(min=0)


def permutation_masks(rank: Tensor, query_positions: Tensor, held: int) -> tuple[Tensor, Tensor]:
    """The content and query streams' boolean masks over [memory, segment] (True: may attend), [B, 1,
    T, M + T] and [B, 1, P, M + T]: a position sees the memory and the tokens up to it in the order
    (content: itself too; query: not its own content)."""
    query_rank = rank.gather(1, query_positions)
    content = rank[:, None, :] <= rank[:, :, None]
    query = rank[:, None, :] < query_rank[:, :, None]
    return F.pad(content, (held, 0), value=True)[:, None], F.pad(query, (held, 0), value=True)[:, None]


def make_head(model: ModelConfig, params: PLMParams) -> nn.Module:
    class TwoStreamHead(nn.Module):
        """The query stream's start, XLNet's mask embedding; the streams run through the model's blocks."""

        def __init__(self) -> None:
            super().__init__()
            self.mask_embedding = nn.Parameter(torch.empty(model.d_model).normal_(0.0, model.init_std))

        def query_states(
            self, encoder: Transformer, batch: dict[str, Tensor], memory: list[Tensor] | None
        ) -> tuple[Tensor, list[Tensor]]:
            """The query stream's last states at the predicted positions, [B, P, d], over a segment that
            continues the one `memory` was kept from (None: a stream's start, or no memory), and the
            memory for the next: each block's content input over the last mem_len positions."""
            ids, rank = batch["input_ids"], batch["rank"]
            b, length = ids.shape
            at = batch["positions"].view(b, -1) - torch.arange(b, device=ids.device)[:, None] * length
            stack = encoder.stack()
            held = 0 if memory is None else memory[0].shape[1]
            masks = permutation_masks(rank, at, held)
            reversed_rows = batch.get("reversed")
            content, _ = stack.entry(encoder.embed_ids(ids), None, False)
            query = encoder.drop(self.mask_embedding.to(content.dtype).expand(b, at.shape[1], -1))
            kept = []
            for i, block in enumerate(stack.blocks):
                previous = None if memory is None else memory[i]
                if encoder.cfg.mem_len:
                    kept.append(next_memory(content, previous, encoder.cfg.mem_len))
                last = i == len(stack.blocks) - 1  # its content output is nobody's input
                content, query = block.two_stream(
                    content, query, masks, at, previous, reversed_rows, content_out=not last
                )
            return stack.exit(query), kept

        def recur(
            self, encoder: Transformer, batch: dict[str, Tensor], memory: list[Tensor] | None
        ) -> tuple[Terms, list[Tensor]]:
            """The step's terms over the segment and its memory, and the memory for the next."""
            states, kept = self.query_states(encoder, batch, memory)
            logits = encoder.lm_logits(states).flatten(0, 1)
            labels = batch["labels"]
            loss = F.cross_entropy(logits.float(), labels)
            return Terms(loss, (logits.argmax(-1) == labels).sum(), labels.numel()), kept

        def forward(self, encoder: Transformer, batch: dict[str, Tensor]) -> Terms:
            return self.recur(encoder, batch, None)[0]

    return TwoStreamHead()


class PermutationLM(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: PLMParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        backward = DECLARED.reversed_rows(params, len(rows))
        # spans are drawn on the text as written (its words start with ▁), then reversed with it
        chosen = predicted_positions(rows, params, generator, pieces.get("word_starts"))
        reversed_rows = (torch.arange(len(rows)) >= len(rows) - backward)[:, None]
        rows = torch.where(reversed_rows, rows.flip(1), rows)
        chosen = torch.where(reversed_rows, chosen.flip(1), chosen)
        rank = factorisation_ranks(chosen, generator)
        extras = {"rank": rank} | ({"reversed": reversed_rows[:, 0]} if backward else {})
        return Pair(rows, rows, noise=chosen, extras=extras)

    def head(self, model: ModelConfig, params: PLMParams) -> nn.Module:
        return make_head(model, params)

    def example_extras(self, batch: dict[str, Tensor], params: PLMParams) -> dict[str, Tensor]:
        rows = len(batch["input_ids"])
        extras = {"rank": torch.zeros_like(batch["input_ids"])}
        if DECLARED.reversed_rows(params, rows):
            extras["reversed"] = torch.zeros(rows, dtype=torch.bool, device="meta")
        return extras

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, params: PLMParams) -> int:
        """Beside the content stream (the model's stack, which the estimate counts): the query stream's
        blocks on the predicted positions, its queries attending to the memory and the segment's keys
        and values (computed once, for both streams) at every distance, and the tied LM head there;
        less the content stream's last block but its keys and values, which no one reads."""
        b, d = batch_size, model.d_model
        keys, layers = model.mem_len + seq_len, model.n_layers
        distances = keys + seq_len - 1

        def block(tokens: int) -> int:  # queries, output, MLP; attention and its distance scores
            matrices = 2 * d * d + (3 if model.mlp == "swiglu" else 2) * d * model.d_ff
            return 2 * b * tokens * matrices + 4 * b * tokens * keys * d + 2 * b * tokens * distances * d

        p = params.predicted(seq_len)
        head = lm_head_weights(d, model.embedding_size, model.vocab_size, model.lm_head == "transform")
        return layers * block(p) + 2 * b * p * head - block(seq_len)


IMPLEMENTATION = PermutationLM()
