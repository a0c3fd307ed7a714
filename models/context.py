"""The validation loss by evaluation context length: how much of a longer context a model uses
(Transformer-XL's evaluation, Dai et al. 2019: its memory lets it attend further at evaluation than it
trained on, where a vanilla segment model stops at its segment).

Every length scores the same tokens: `rows` streams of `span` tokens from the start of the validation
split, each token after a stream's first predicted once, its loss kept by block of `block` consecutive
tokens (what a paired bootstrap between two models resamples: lmpipe/report/context.py). A model with
Transformer-XL's positions reads segments of its training length over a memory of L - seq_len states
(segments of L, no memory, for L up to seq_len); any other causal decoder reads segments of L without
memory, up to its max_len: the attention length at a segment's last token is L in both."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from models.transformer import Transformer

BLOCK = 128  # tokens a block: the unit a paired bootstrap resamples


def evaluable(model: Transformer, length: int) -> bool:
    """Whether the model can attend to `length` tokens: any with relative positions (a memory), within
    max_len for the others."""
    return model.cfg.positions == "xl" or length <= model.cfg.max_len


@torch.no_grad()
def loss_by_context(
    model: Transformer,
    tokens: np.ndarray,
    seq_len: int,
    lengths: Sequence[int],
    rows: int,
    span: int,
    block: int = BLOCK,
) -> dict[int, np.ndarray]:
    """The next-token loss (nats) at each evaluable length of `lengths`, over the same tokens: the mean
    of each block, [rows, (span - 1) / block]."""
    if len(tokens) < rows * span:
        raise ValueError(f"{len(tokens)} validation tokens, fewer than {rows} streams of {span}")
    if (span - 1) % block:
        raise ValueError(f"a stream's {span - 1} predicted tokens are not whole blocks of {block}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    streams = torch.from_numpy(tokens[: rows * span].astype(np.int64)).view(rows, span).to(device)
    losses = {}
    for length in (length for length in lengths if evaluable(model, length)):
        segment = min(length, seq_len) if model.cfg.positions == "xl" else length
        token_losses, memory = [], None
        for start in range(0, span - 1, segment):
            ids = streams[:, start : min(start + segment, span - 1)]
            if length > segment:  # Transformer-XL: the segment over the memory of the last length - seq_len
                hidden, memory = model.recur(ids, memory, mem_len=length - segment)
            else:
                hidden = model.decode(ids)
            labels = streams[:, start + 1 : start + 1 + ids.shape[1]]
            logits = model.lm_logits(hidden).float()
            token_losses.append(F.cross_entropy(logits.transpose(1, 2), labels, reduction="none"))
        per_token = torch.cat(token_losses, dim=1).double().cpu().numpy()
        losses[length] = per_token.reshape(rows, -1, block).mean(-1)
    model.train(was_training)
    return losses
