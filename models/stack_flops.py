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


def lm_head_weights(
    d_model: int, embedding_size: int | None, vocab_size: int, transform: bool = False
) -> int:
    """The tied LM head's matmul weights: d·V, or with factorized embeddings the projection back to E
    and E·V; with BERT's transform, its dense layer to the embeddings' width w and w·V."""
    width = embedding_size or d_model
    return d_model * width + width * vocab_size if embedding_size or transform else d_model * vocab_size
