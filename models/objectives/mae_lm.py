"""MAE-LM (Meng et al., 2024, "Representation Deficiency in Masked Language Modeling"): the encoder never
sees [MASK]. The selected tokens (15 %) are held out of the encoder's attention, as padding is, so the
unmasked tokens are encoded from one another alone, each at its own position; a small bidirectional
decoder (`decoder_layers`, the encoder's width; discarded after pretraining) reads the encoder's
states with [MASK] embeddings (and their positions) in the held-out places and predicts those tokens
through the tied LM head. Only the encoder fine-tunes and exports. The held-out tokens are masked
out of the attention, not gathered away: the encoder computes the row's full length (the FLOPs count
says so), where MAE-LM's gathers the 85 % it reads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import ModelConfig
from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces, Terms
from models.objectives.mlm import mask_tokens
from models.pair import Pair
from models.special import SPECIAL
from models.specs.objectives.mae_lm import OBJECTIVE as DECLARED
from models.specs.objectives.mae_lm import MaeLmParams
from models.stack_flops import lm_head_weights, stack_forward_flops
from models.transformer import Stack, Transformer, init_normal


def make_head(model: ModelConfig, params: MaeLmParams) -> nn.Module:
    class MaeLmHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers = params.decoder_layers
            self.cfg = model.with_(n_layers=layers, share_layers="none", layer_groups=1)
            self.stack = Stack(self.cfg, layers, causal=False, cross=False)
            self.apply(lambda module: init_normal(module, model.init_std))

        def forward(self, encoder: Transformer, batch: dict[str, Tensor]) -> Terms:
            ids, positions, labels = batch["input_ids"], batch["positions"], batch["labels"]
            pad_mask = batch.get("pad_mask")
            held_out = torch.zeros(ids.numel(), dtype=torch.bool, device=ids.device)
            held_out = held_out.index_fill(0, positions, True).view_as(ids)
            visible = ~held_out if pad_mask is None else pad_mask & ~held_out
            states = encoder(ids, visible, prefix_lengths=batch.get("prefix_lengths"))
            masks = encoder.embed_ids(
                torch.full_like(ids, SPECIAL.mask)
            )  # [MASK] at each place, its position
            # the decoder's heads are the encoder's: its rotary tables too
            decoded = self.stack(torch.where(held_out[..., None], masks, states), pad_mask, encoder.rope())
            logits = encoder.lm_logits(decoded.reshape(-1, model.d_model).index_select(0, positions))
            loss = F.cross_entropy(logits.float(), labels)
            return Terms(loss, (logits.argmax(-1) == labels).sum(), labels.numel())

    return MaeLmHead()


class MaeLm(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: MaeLmParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        masked = mask_tokens(rows, generator, vocab_size, params.mask_rate, 1.0, 0.0)
        return Pair(masked.input_ids, rows, noise=masked.selected)

    def head(self, model: ModelConfig, params: MaeLmParams) -> nn.Module:
        return make_head(model, params)

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, params: MaeLmParams) -> int:
        """The decoder over the row, the [MASK] embeddings' projection (factorized embeddings) and the
        tied LM head at the held-out tokens."""
        b, d, e = batch_size, model.d_model, model.embedding_size
        flops = stack_forward_flops(b, seq_len, params.decoder_layers, d, model.d_ff, model.mlp)
        flops += 2 * b * seq_len * e * d if e else 0
        predicted = round(DECLARED.widths(seq_len, params)[2] * b)
        return flops + 2 * predicted * lm_head_weights(d, e, model.vocab_size, model.lm_head == "transform")


IMPLEMENTATION = MaeLm()
