"""Closed-form forward FLOPs of a stack's matmuls, torch-free: what models/flops.py's estimate and an
objective's `head_flops` (ELECTRA's generator) share, without importing the training code."""

from __future__ import annotations


def block_weights(d_model: int, d_ff: int, mlp: str) -> int:
    """The weights of one block's matrices: attention's q, k, v and output, and the MLP's (three with
    SwiGLU). Biases and norms are left out, as Kaplan's N leaves them."""
    return 4 * d_model * d_model + (3 if mlp == "swiglu" else 2) * d_model * d_ff


def stack_forward_flops(batch: int, tokens: int, layers: int, d: int, d_ff: int, mlp: str) -> int:
    """A self-attention stack's forward FLOPs over `tokens` a row: its matmul weights and attention."""
    return (
        2 * batch * tokens * layers * block_weights(d, d_ff, mlp) + layers * 4 * batch * tokens * tokens * d
    )


def distances(tokens: int, memory: int, causal: bool) -> int:
    """The relative distances Transformer-XL's attention encodes: memory + tokens causally (0 up), and
    the tokens - 1 negative ones too both ways."""
    return memory + tokens if causal else memory + 2 * tokens - 1


def relative_attention_flops(
    batch: int, tokens: int, memory: int, layers: int, d: int, causal: bool, signs: int = 1
) -> int:
    """What Transformer-XL's relative attention adds to a stack's forward count (stack_forward_flops):
    per layer, the keys and values of `memory` states and attention over them, the projection of the
    distances' sinusoids (once a step, not a row; for both signs with XLNet's bidirectional data) and
    each query's score at every distance."""
    r = distances(tokens, memory, causal)
    per_layer = 2 * batch * memory * 2 * d * d + 4 * batch * tokens * memory * d
    return layers * (per_layer + signs * 2 * r * d * d + 2 * batch * tokens * r * d)


def sinusoid_projection_flops(
    tokens: int, memory: int, layers: int, d: int, causal: bool, signs: int = 1
) -> int:
    """The forward FLOPs of projecting the distances' sinusoids: an input with no gradient, so its
    backward pass costs them once (the weights' gradient), not twice."""
    return layers * signs * 2 * distances(tokens, memory, causal) * d * d


def lm_head_weights(
    d_model: int, embedding_size: int | None, vocab_size: int, transform: bool = False
) -> int:
    """The tied LM head's matmul weights: d·V, or with factorized embeddings the projection back to E
    and E·V; with BERT's transform, its dense layer to the embeddings' width w and w·V."""
    width = embedding_size or d_model
    return d_model * width + width * vocab_size if embedding_size or transform else d_model * vocab_size
