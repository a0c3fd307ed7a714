"""The block library and the model built from it (in the spirit of nanoGPT's model.py).

The architecture (models/architectures) says which stacks a model has: a bidirectional encoder, a
causal decoder, or both (the decoder then cross-attends to the encoder), and how its hidden states are
computed from them. Token embeddings are tied to the LM head; `lm_logits` takes hidden states already
gathered at the positions that need a prediction.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.architectures.base import architecture
from models.config import ModelConfig
from models.special import SPECIAL


def make_norm(cfg: ModelConfig, width: int | None = None) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(width or cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(width or cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


def sinusoidal_table(length: int, dim: int) -> Tensor:
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table


def rope_tables(length: int, head_dim: int) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., :h/2], x[..., h/2:]) of a [B, H, T, h] tensor by position-dependent angles."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def xl_sinusoids(distances: Tensor, dim: int) -> Tensor:
    """Transformer-XL's encodings of relative distances (XLNet's layout: the sines, then the cosines)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=distances.device) / dim))
    angles = distances.float()[:, None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's per-head slopes (Press et al., 2022): 2^(-8/n), its powers, for n heads a power of two;
    otherwise those of the power of two below and every other one of twice that, as the paper's code."""

    def geometric(n: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    below = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(geometric(below) + geometric(2 * below)[0::2][: n_heads - below])


def relative_buckets(relative: Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative position (key - query): exact up to half the buckets, log-spaced up
    to `max_distance`, the last bucket beyond; a causal stack buckets the past only, a bidirectional
    one gives half the buckets to each side."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        buckets = (relative > 0).long() * n_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = n_buckets // 2
    spread = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = (exact + (spread * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class PositionBias(nn.Module):
    """The additive attention bias of a stack's self-attention, [1, H, T, T]: ALiBi's fixed linear
    penalty on distance (symmetric in a bidirectional stack), or T5's learnt bias per head and relative
    bucket, one table per stack, shared by its layers (T5: 32 buckets to distance 128)."""

    def __init__(self, cfg: ModelConfig, n_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_buckets, self.max_distance = n_buckets, max_distance
        self.table = nn.Embedding(n_buckets, cfg.n_heads) if cfg.positions == "relative" else None

    def forward(self, length: int, causal: bool, device: torch.device) -> Tensor:
        position = torch.arange(length, device=device)
        relative = position[None, :] - position[:, None]  # key - query
        if self.table is None:
            slopes = alibi_slopes(self.n_heads).to(device)
            return -(slopes[:, None, None] * relative.abs()).unsqueeze(0)
        buckets = relative_buckets(relative, not causal, self.n_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1).unsqueeze(0)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        d = cfg.d_model
        self.cross = cross
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        # Transformer-XL's relative attention: keys and values over a memory too, no biases (as its
        # code and XLNet's), the distances' sinusoids projected per layer, and its u and v per head
        self.relative = cfg.positions == "xl" and not cross
        bias = cfg.bias and not self.relative
        if cross or self.relative:
            self.q = nn.Linear(d, d, bias=bias)
            self.kv = nn.Linear(d, 2 * d, bias=bias)
        else:
            self.qkv = nn.Linear(d, 3 * d, bias=bias)
        if self.relative:
            self.r = nn.Linear(d, d, bias=False)
            self.content_bias = nn.Parameter(torch.zeros(cfg.n_heads, cfg.head_dim))  # u
            self.position_bias = nn.Parameter(torch.zeros(cfg.n_heads, cfg.head_dim))  # v
        self.out = nn.Linear(d, d, bias=bias)
        # prefix-tuning's keys and values before the sequence's, where a fine-tune adds them
        # (models/finetune_methods.py: (k, v, mask, causal) -> (k, v, mask))
        self.prefix = None

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, -1).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        memory: Tensor | None = None,
        distances: Tensor | None = None,
        keys_values: tuple[Tensor, Tensor] | None = None,
        query_positions: Tensor | None = None,
    ) -> Tensor:
        if self.relative:
            return self._relative(x, mask, causal, memory, distances, keys_values, query_positions)
        if self.cross:
            q, (k, v) = self.q(x), self.kv(context).chunk(2, dim=-1)
        else:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.prefix is not None:
            k, v, mask = self.prefix(k, v, mask, causal)
        if mask is not None and mask.is_floating_point():  # a position bias: in the queries' dtype
            mask = mask.to(q.dtype)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal and mask is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out(y.transpose(1, 2).reshape(x.shape))

    def _relative(
        self,
        x: Tensor,
        mask: Tensor | None,
        causal: bool,
        memory: Tensor | None,
        distances: Tensor | None = None,
        keys_values: tuple[Tensor, Tensor] | None = None,
        query_positions: Tensor | None = None,
    ) -> Tensor:
        """Transformer-XL's attention over [memory, x]: (q + u)·k on content, (q + v)·W_r R(i - j) on
        the distance, the second as SDPA's additive mask (with -inf where `mask` forbids).

        Shared by XLNet's two streams in a layer, made once (default: made here): `distances`, the
        encodings `distance_keys` made, and `keys_values`, those of `keys_values` (the content stream's).
        The query stream's queries are at `query_positions` [B, P] of the segment (default: the queries
        are the segment's own positions)."""
        k, v = self.keys_values(x, memory) if keys_values is None else keys_values
        q = self._heads(self.q(x))
        n_keys = k.shape[2]
        length = n_keys - (0 if memory is None else memory.shape[1])
        if mask is None and causal:  # query i sees the memory and x up to itself
            mask = torch.ones(length, n_keys, dtype=torch.bool, device=x.device).tril(n_keys - length)
        if distances is None:
            distances = self.distance_keys(length, n_keys, causal, x.device, x.dtype)
        scores = self._distance_scores(q, distances, length, n_keys, query_positions) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        y = F.scaled_dot_product_attention(
            q + self.content_bias[:, None],
            k,
            v,
            attn_mask=scores.to(q.dtype),
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out(y.transpose(1, 2).reshape(x.shape))

    def keys_values(self, x: Tensor, memory: Tensor | None) -> tuple[Tensor, Tensor]:
        """The relative attention's keys and values, [B, H, M + T, h] each, of the memory and `x`."""
        keys = x if memory is None else torch.cat([memory, x], dim=1)
        k, v = self.kv(keys).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def distance_keys(
        self,
        length: int,
        n_keys: int,
        causal: bool,
        device: torch.device,
        dtype: torch.dtype,
        reversed_rows: Tensor | None = None,
    ) -> Tensor:
        """W_r R(d) for the distances d = i - j a segment of `length` over `n_keys` keys (its memory
        first) attends at, [B or 1, R, H, h]: causally 0 up (j after i never attended), both ways from
        1 - length. Rows set in `reversed_rows` (XLNet's bidirectional data: a stream read backward)
        take the encodings of -d, as its code's backward position sequence."""
        lowest = 0 if causal else 1 - length
        distance = torch.arange(lowest, n_keys, device=device)
        if reversed_rows is None:
            return self.r(xl_sinusoids(distance, self.q.in_features).to(dtype))[None]
        both = self.r(xl_sinusoids(torch.cat([distance, -distance]), self.q.in_features).to(dtype))
        forward, backward = both.chunk(2)
        return torch.where(reversed_rows[:, None, None], backward, forward)

    def _distance_scores(
        self, q: Tensor, distances: Tensor, length: int, n_keys: int, query_positions: Tensor | None
    ) -> Tensor:
        """(q_i + v)·W_r R(d) for each query i and key j, d = i - j counted over the memory (the
        queries at `query_positions` of the segment, else its own positions)."""
        b, h, queries, head = q.shape
        r = distances.view(distances.shape[0], distances.shape[1], h, head)
        scores = torch.einsum("bhtd,brhd->bhtr", q + self.position_bias[:, None], r.expand(b, -1, -1, -1))
        at = torch.arange(queries, device=q.device)[None] if query_positions is None else query_positions
        lowest = n_keys - r.shape[1]  # 0 causally, 1 - length both ways
        index = at[:, None, :, None] + (n_keys - length) - torch.arange(n_keys, device=q.device) - lowest
        index = index.clamp(0, r.shape[1] - 1)
        return scores.gather(-1, index.expand(b, h, queries, n_keys))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, (2 if self.swiglu else 1) * cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.swiglu:
            gate, value = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * value)
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Self-attention, optional cross-attention, MLP; each a residual branch with pre- or post-norm."""

    def __init__(self, cfg: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.self_attn, self.norm1 = Attention(cfg), make_norm(cfg)
        self.cross_attn = Attention(cfg, cross=True) if cross else None
        self.norm_cross = make_norm(cfg) if cross else None
        self.mlp, self.norm2 = MLP(cfg), make_norm(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def _residual(self, x: Tensor, norm: nn.Module, branch) -> Tensor:
        if self.pre_norm:
            return x + self.drop(branch(norm(x)))
        return norm(x + self.drop(branch(x)))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        causal: bool,
        rope: tuple[Tensor, Tensor] | None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        memory: Tensor | None = None,
    ) -> Tensor:
        """`memory`: Transformer-XL's, the states that entered this block over the previous segment
        (pre-LN: normalised as its input is)."""
        if memory is not None and self.pre_norm:
            memory = self.norm1(memory)
        x = self._residual(
            x, self.norm1, lambda h: self.self_attn(h, mask=mask, causal=causal, rope=rope, memory=memory)
        )
        if self.cross_attn is not None and context is not None:  # a shared stack encoding: no memory
            x = self._residual(x, self.norm_cross, lambda h: self.cross_attn(h, context, mask=context_mask))
        return self._residual(x, self.norm2, self.mlp)

    def two_stream(
        self,
        content: Tensor,
        query: Tensor,
        masks: tuple[Tensor, Tensor],
        query_positions: Tensor,
        memory: Tensor | None = None,
        reversed_rows: Tensor | None = None,
        content_out: bool = True,
    ) -> tuple[Tensor | None, Tensor]:
        """XLNet's two-stream attention through this block's weights (Yang et al., 2019, §2.3): the
        content stream as `forward` computes it under the permutation's content mask, and the query
        stream (the positions to predict, `query_positions` [B, P]) attending to the content stream's
        keys and values under its query mask, which hides each position's own content. `masks`: the
        two boolean masks over [memory, segment]; the distances' encodings, keys and values are made once
        for both. Without `content_out` (the last block: only the query stream predicts) the content
        stream's own output is not computed."""
        content_mask, query_mask = masks
        attention = self.self_attn
        held = 0 if memory is None else memory.shape[1]
        length = content.shape[1]
        distances = attention.distance_keys(
            length, held + length, False, content.device, content.dtype, reversed_rows
        )
        if memory is not None and self.pre_norm:
            memory = self.norm1(memory)
        keys_values = attention.keys_values(self.norm1(content) if self.pre_norm else content, memory)
        shared = {"memory": memory, "distances": distances, "keys_values": keys_values}
        query = self._residual(
            query,
            self.norm1,
            lambda g: attention(g, mask=query_mask, query_positions=query_positions, **shared),
        )
        query = self._residual(query, self.norm2, self.mlp)
        if not content_out:
            return None, query
        content = self._residual(content, self.norm1, lambda h: attention(h, mask=content_mask, **shared))
        return self._residual(content, self.norm2, self.mlp), query


# what ALBERT's `share_layers` shares between the layers of a group: each branch with its norm
SHARED_PARTS = {"attention": ("self_attn", "norm1", "cross_attn", "norm_cross"), "ffn": ("mlp", "norm2")}


def stack_blocks(cfg: ModelConfig, n_layers: int, cross: bool) -> list[Block]:
    """A stack's blocks: its own to each layer, or shared within `layer_groups` consecutive groups
    (ALBERT: layer i in group i·G // L), whole or by branch; the first layer of a group owns them."""
    if cfg.share_layers == "none":
        return [Block(cfg, cross) for _ in range(n_layers)]
    owners: dict[int, Block] = {}
    if cfg.share_layers == "all":
        return [
            owners.setdefault(i * cfg.layer_groups // n_layers, Block(cfg, cross)) for i in range(n_layers)
        ]
    blocks = [Block(cfg, cross) for _ in range(n_layers)]
    for i, block in enumerate(blocks):
        owner = owners.setdefault(i * cfg.layer_groups // n_layers, block)
        for part in SHARED_PARTS[cfg.share_layers]:
            setattr(block, part, getattr(owner, part))
    return blocks


class Stack(nn.Module):
    def __init__(
        self, cfg: ModelConfig, n_layers: int, causal: bool, cross: bool, projected: bool = False
    ) -> None:
        super().__init__()
        self.causal = causal
        self.blocks = nn.ModuleList(stack_blocks(cfg, n_layers, cross))
        # pre-norm stacks end in a norm; post-norm ones normalise the embeddings instead (BERT)
        self.pre_norm = cfg.norm_position == "pre"
        # post-LN: a norm on the stack's input (BERT's on the embeddings, then their dropout), except
        # where the embeddings are normalised before a projection to its width (ALBERT's, ELECTRA's
        # generator's); pre-LN: on its output
        # Transformer-XL's and XLNet's post-LN stacks take the embeddings as they are
        self.norms_input = (
            not self.pre_norm and cfg.embedding_size is None and not projected and cfg.positions != "xl"
        )
        self.edge_norm = make_norm(cfg) if self.pre_norm or self.norms_input else None
        self.input_drop = nn.Dropout(cfg.dropout) if self.norms_input else None
        self.position_bias = PositionBias(cfg) if cfg.positions in ("alibi", "relative") else None

    def forward(
        self,
        x: Tensor,
        pad_mask: Tensor | None,
        rope: tuple[Tensor, Tensor] | None,
        context: Tensor | None = None,
        context_pad_mask: Tensor | None = None,
        prefix_lengths: Tensor | None = None,
        causal: bool | None = None,
    ) -> Tensor:
        causal = self.causal if causal is None else causal  # a shared stack encodes bidirectionally
        x, mask = self.entry(x, pad_mask, causal, prefix_lengths)
        context_mask = None if context_pad_mask is None else context_pad_mask[:, None, None, :]
        for block in self.blocks:
            x = block(x, mask, causal, rope, context, context_mask)
        return self.exit(x)

    def entry(
        self, x: Tensor, pad_mask: Tensor | None, causal: bool, prefix_lengths: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The first block's input (post-LN: normalised and dropped out) and the self-attention mask the
        blocks share (None: SDPA's own causal or full attention): what a head that runs some of the
        blocks itself starts from (multi-token prediction's trunk)."""
        mask = attention_mask(pad_mask, causal, x.shape[1], x.device, prefix_lengths)
        if self.position_bias is not None:
            mask = biased_mask(self.position_bias(x.shape[1], causal, x.device), mask, causal)
        if self.norms_input:
            x = self.input_drop(self.edge_norm(x))
        return x, mask

    def exit(self, x: Tensor) -> Tensor:
        """The last block's output as the stack's: pre-LN, through its final norm."""
        return self.edge_norm(x) if self.pre_norm else x

    def recur(
        self,
        x: Tensor,
        pad_mask: Tensor | None,
        rope: tuple[Tensor, Tensor] | None,
        memory: list[Tensor] | None,
        mem_len: int,
    ) -> tuple[Tensor, list[Tensor]]:
        """Transformer-XL's segment-level recurrence: each block attends to its memory too (the states
        that entered it over the previous segments, cut from the graph) as well as to the segment
        causally. The states, and the new memory: each block's input over the last `mem_len` positions
        of the memory and this segment."""
        held = 0 if memory is None else memory[0].shape[1]
        mask = attention_mask(pad_mask, self.causal, x.shape[1], x.device, memory=held)
        x, _ = self.entry(x, None, self.causal)
        kept = []
        for i, block in enumerate(self.blocks):
            previous = None if memory is None else memory[i]
            kept.append(next_memory(x, previous, mem_len))
            x = block(x, mask, self.causal, rope, memory=previous)
        return self.exit(x), kept


def next_memory(entering: Tensor, previous: Tensor | None, mem_len: int) -> Tensor:
    """A block's memory for the next segment: the states that entered it over the last `mem_len`
    positions of its memory and this segment, cut from the graph (Transformer-XL's, XLNet's)."""
    entered = entering if previous is None else torch.cat([previous, entering], dim=1)
    return entered[:, -mem_len:].detach()


def attention_mask(
    pad_mask: Tensor | None,
    causal: bool,
    length: int,
    device: torch.device,
    prefix_lengths: Tensor | None = None,
    memory: int = 0,
) -> Tensor | None:
    """Boolean [B, 1, T, M + T] mask (True = may attend), or None when SDPA's fast paths apply. A
    causal stack given `prefix_lengths` attends fully within each row's prefix (a prefix LM): a prefix
    position sees the whole prefix and nothing after it, a later position the prefix and the positions
    before it. `memory`: Transformer-XL's M states before the segment, which every query sees."""
    if pad_mask is None and prefix_lengths is None and not memory:
        return None
    keys = memory + length
    mask = (
        torch.ones(1, 1, 1, keys, dtype=torch.bool, device=device)
        if pad_mask is None
        else F.pad(pad_mask, (memory, 0), value=True)[:, None, None, :]
    )
    if causal:
        visible = torch.ones(length, keys, dtype=torch.bool, device=device).tril(memory)
        if prefix_lengths is not None:
            in_prefix = torch.arange(length, device=device) < prefix_lengths[:, None]  # [B, T] keys
            visible = (visible | in_prefix[:, None, :])[:, None]
        mask = mask & visible
    return mask


def init_normal(module: nn.Module, std: float) -> None:
    """Our initialisation of one module (for `Module.apply`): weights of linear layers and embeddings
    from N(0, std), biases zero; the pretraining heads use it too."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def segment_ids(ids: Tensor) -> Tensor:
    """BERT's segments of `[CLS] A [SEP] B [SEP]`: 0 up to and with the first [SEP], 1 after it."""
    sep = (ids == SPECIAL.sep).long()
    return (sep.cumsum(1) - sep).clamp(max=1)


def biased_mask(bias: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """A position bias as SDPA's float mask: -inf where the boolean mask (or causality) forbids. SDPA
    then runs its kernels for arbitrary masks, not the fused causal one (docs/models.md)."""
    length = bias.shape[-1]
    if mask is None and causal:
        mask = torch.ones(length, length, dtype=torch.bool, device=bias.device).tril()
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


class Transformer(nn.Module):
    """The stacks of `cfg.arch`, and the embeddings they share."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        width = cfg.embedding_size or cfg.d_model  # ALBERT's E
        self.embed = nn.Embedding(cfg.vocab_size, width)
        self.positions = nn.Embedding(cfg.max_len, width) if cfg.positions == "learned" else None
        self.segments = nn.Embedding(2, width) if cfg.segment_embeddings else None
        if cfg.positions == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(cfg.max_len, width), persistent=False)
        # ALBERT's projection of the E-wide embeddings to the model's width, tied back in the LM head;
        # post-LN, the embeddings are normalised at E before it (ALBERT's LayerNorm)
        self.embed_projection = nn.Linear(width, cfg.d_model, bias=cfg.bias) if cfg.embedding_size else None
        post_ln = cfg.norm_position == "post"
        self.embed_norm = make_norm(cfg, width) if cfg.embedding_size and post_ln else None
        # BERT's prediction head: a dense layer to the embeddings' width, GELU, LayerNorm; an output bias
        self.lm_transform, self.lm_bias = None, None
        if cfg.lm_head == "transform":
            self.lm_transform = nn.Sequential(
                nn.Linear(cfg.d_model, width), nn.GELU(), nn.LayerNorm(width, eps=cfg.norm_eps)
            )
            self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        # word2vec's output vectors, apart from the input ones
        self.unembed = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False) if cfg.lm_head == "untied" else None
        if cfg.positions == "rope":
            cos, sin = rope_tables(cfg.max_len, cfg.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.arch = architecture(cfg.arch)
        self.encoder, self.decoder = self.arch.stacks(cfg)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        init_normal(module, self.cfg.init_std)

    def embed_ids(self, ids: Tensor) -> Tensor:
        """The input of a stack: the embeddings, projected to d_model where factorized, dropout (a
        post-LN stack's own input norm comes first: it drops them out itself)."""
        x = self.embeddings(ids)
        if self.embed_norm is not None:  # ALBERT's: normalised and dropped out at E, then projected
            return self.embed_projection(self.drop(self.embed_norm(x)))
        if self.embed_projection is not None:
            x = self.embed_projection(x)
        return x if self.cfg.norm_position == "post" else self.drop(x)

    def embedding_norm(self) -> nn.Module | None:
        """The norm BERT applies to the embeddings (at E before a projection, else the encoder's input
        norm), which ELECTRA's generator shares; None pre-LN."""
        if self.embed_norm is not None:
            return self.embed_norm
        stack = self.encoder if self.encoder is not None else self.decoder
        # an architecture's own stacks (an LSTM's, CBOW's window) have no input norm
        return stack.edge_norm if isinstance(stack, Stack) and stack.norms_input else None

    def embeddings(self, ids: Tensor) -> Tensor:
        """The tokens' embeddings with their positions and segments, before any projection (E wide
        with factorized embeddings): what ELECTRA's generator shares."""
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence of {ids.shape[1]} tokens exceeds max_len={self.cfg.max_len}")
        x = self.embed(ids)
        if self.segments is not None:
            x = x + self.segments(segment_ids(ids))
        if self.positions is not None:
            x = x + self.positions.weight[: ids.shape[1]]
        elif self.cfg.positions == "sinusoidal":
            x = x + self.sinusoid[: ids.shape[1]].to(x.dtype)
        return x

    def rope(self) -> tuple[Tensor, Tensor] | None:
        return (self.rope_cos, self.rope_sin) if self.cfg.positions == "rope" else None

    def encode(self, ids: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        assert self.arch.encoder, "this architecture has no encoder"
        if self.encoder is None:  # shared with the decoder
            return self.decoder(self.embed_ids(ids), pad_mask, self.rope(), causal=False)
        return self.encoder(self.embed_ids(ids), pad_mask, self.rope())

    def decode(
        self,
        ids: Tensor,
        pad_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_pad_mask: Tensor | None = None,
        prefix_lengths: Tensor | None = None,
    ) -> Tensor:
        assert self.decoder is not None, "this architecture has no decoder"
        return self.decoder(
            self.embed_ids(ids), pad_mask, self.rope(), memory, memory_pad_mask, prefix_lengths
        )

    def recur(
        self,
        ids: Tensor,
        memory: list[Tensor] | None,
        pad_mask: Tensor | None = None,
        mem_len: int | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """The states over a segment that continues the one its `memory` was kept from (Transformer-XL:
        Stack.recur; an encoder's attend to the memory and the whole segment, as XLNet's), and the
        memory for the next: `mem_len` states (its config's
        unless given: an evaluation may attend further than training did)."""
        mem_len = self.cfg.mem_len if mem_len is None else mem_len
        assert self.cfg.positions == "xl" and mem_len, "Transformer-XL's"
        return self.stack().recur(self.embed_ids(ids), pad_mask, self.rope(), memory, mem_len)

    def stack(self) -> Stack:
        """The model's only stack (an encoder's or a decoder-only model's)."""
        assert (self.encoder is None) != (self.decoder is None), "a model of one stack"
        return self.encoder if self.encoder is not None else self.decoder

    def forward(
        self,
        ids: Tensor,
        pad_mask: Tensor | None = None,
        decoder_ids: Tensor | None = None,
        decoder_pad_mask: Tensor | None = None,
        prefix_lengths: Tensor | None = None,
    ) -> Tensor:
        """Hidden states of the last stack, as the architecture computes them (an encoder-decoder's
        decoder reads `decoder_ids`; a prefix LM attends fully within each row's prefix)."""
        return self.arch.hidden(self, ids, pad_mask, decoder_ids, decoder_pad_mask, prefix_lengths)

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """Tied output embedding: logits over the vocabulary for the given hidden states (factorized
        embeddings: projected back to E through the input projection's matrix first; BERT's head:
        through its transform, and the output bias added; untied: through output vectors of its own)."""
        if self.unembed is not None:
            return self.unembed(hidden)
        if self.lm_transform is not None:
            return F.linear(self.lm_transform(hidden), self.embed.weight, self.lm_bias)
        if self.embed_projection is not None:
            hidden = hidden @ self.embed_projection.weight
        return F.linear(hidden, self.embed.weight)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups of the weights that train: weight decay on weight matrices, none on norms,
    biases and embeddings."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:  # a frozen backbone's
            continue
        (decay if param.ndim >= 2 and id(param) not in embeddings else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def load_pretrained(directory: str | Path) -> tuple[Transformer, dict]:
    """A model exported by `pretrain` (`config.json` + `model.safetensors`; no pickle) and its config."""
    from safetensors.torch import load_model

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    model = Transformer(ModelConfig(**config["model"]))
    load_model(model, str(directory / "model.safetensors"))
    return model, config
