"""Multi-token prediction: at every position, the next token and the `depth` tokens after it, each through
the model's tied unembedding; the next token's loss is the step's token loss (`val/loss` is the causal
LM's quantity), each deeper one's an extra term (`ahead_<k>`: the token k ahead).

- parallel (Gloeckle et al., 2024, "Better & Faster Large Language Models via Multi-token Prediction"):
  a shared trunk, the decoder's first L - 1 blocks, and n = depth + 1 heads of one block each; the
  model's last block is the next token's head, so the model alone is a plain decoder (what fine-tunes
  and exports). Every head's output goes through the stack's final norm and the shared unembedding, as
  their released code's `prediction_heads = [self.layers[-1]] + list(self.extra_heads)`. The losses
  are summed.
- sequential (DeepSeek-V3, Liu et al., 2024, §2.2): after the whole model, module k joins the previous
  depth's states (before their final norm) with the embedding of the token k ahead, each normalised,
  through a linear projection from 2d to d and one block, then its own final norm and the shared
  unembedding: the prediction of the token k + 1 ahead keeps the complete causal chain. The step
  minimises the next token's loss plus λ/D times each module's (λ 0.3).

The rows are `depth` tokens longer than the causal LM's; those tokens ride beside its pair as
`future_ids` (the labels past the row's end), so the trunk reads exactly the causal LM's batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import ModelConfig
from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces, Terms
from models.pair import Pair
from models.specs.objectives.mtp import MTPParams
from models.stack_flops import lm_head_weights, stack_forward_flops
from models.transformer import Block, Transformer, init_normal, make_norm


def scored(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy in fp32 over flat logits, and the correct predictions."""
    logits = logits.flatten(0, 1)
    return F.cross_entropy(logits.float(), labels.flatten()), (logits.argmax(-1) == labels.flatten()).sum()


def tokens_ahead(batch: dict[str, Tensor]) -> Tensor:
    """Each row's tokens from its first label on: the token k + 1 ahead of position i is at [:, i + k]."""
    ids = batch["input_ids"]
    return torch.cat([batch["labels"].reshape(ids.shape), batch["future_ids"]], dim=1)


def make_head(model: ModelConfig, params: MTPParams) -> nn.Module:
    weight = params.depth_weight()

    class MTPHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sequential = params.form == "sequential"
            self.blocks = nn.ModuleList(Block(model) for _ in range(params.depth))
            if self.sequential:  # DeepSeek-V3's RMSNorm in the model's norm, whichever it is
                self.state_norms = nn.ModuleList(make_norm(model) for _ in range(params.depth))
                self.embed_norms = nn.ModuleList(make_norm(model) for _ in range(params.depth))
                self.projections = nn.ModuleList(
                    nn.Linear(2 * model.d_model, model.d_model, bias=False) for _ in range(params.depth)
                )
                pre_norm = model.norm_position == "pre"  # a post-LN block's output is normalised
                self.out_norms = nn.ModuleList(
                    make_norm(model) if pre_norm else nn.Identity() for _ in range(params.depth)
                )
            self.apply(lambda module: init_normal(module, model.init_std))

        def depth_states(self, decoder: Transformer, batch: dict[str, Tensor]) -> list[Tensor]:
            """The states each depth's unembedding reads, the next token's first: [B, T, d] each."""
            ids = batch["input_ids"]
            stack, rope = decoder.decoder, decoder.rope()
            x, mask = stack.entry(
                decoder.embed_ids(ids), batch.get("pad_mask"), True, batch.get("prefix_lengths")
            )
            for block in stack.blocks[:-1]:
                x = block(x, mask, True, rope)
            if not self.sequential:  # the trunk's states into each head, the model's last block the first
                return [stack.exit(head(x, mask, True, rope)) for head in (stack.blocks[-1], *self.blocks)]
            states = [stack.blocks[-1](x, mask, True, rope)]
            outputs = [stack.exit(states[0])]
            ahead = tokens_ahead(batch)
            for k, block in enumerate(self.blocks, start=1):
                embedded = decoder.embed_ids(ahead[:, k - 1 : k - 1 + ids.shape[1]])  # the token k ahead
                joined = torch.cat(
                    [self.state_norms[k - 1](states[-1]), self.embed_norms[k - 1](embedded)], -1
                )
                states.append(block(self.projections[k - 1](joined), mask, True, rope))
                outputs.append(self.out_norms[k - 1](states[-1]))
            return outputs

        def forward(self, decoder: Transformer, batch: dict[str, Tensor]) -> Terms:
            outputs = self.depth_states(decoder, batch)
            ahead, length = tokens_ahead(batch), batch["input_ids"].shape[1]
            labels = ahead[:, :length]  # every position predicts: the causal LM's batch
            loss, correct = scored(decoder.lm_logits(outputs[0]), labels)
            extra, accuracies = {}, {}
            for k, states in enumerate(outputs[1:], start=1):
                target = ahead[:, k : k + length]
                depth_loss, depth_correct = scored(decoder.lm_logits(states), target)
                extra[f"ahead_{k + 1}"] = (depth_loss, weight)
                accuracies[f"ahead_{k + 1}"] = depth_correct / target.numel()
            return Terms(loss, correct, labels.numel(), extra, accuracies)

    return MTPHead()


class MultiTokenPrediction(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: MTPParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        depth = params.depth
        return Pair(rows[:, :0], rows[:, :-depth], extras={"future_ids": rows[:, -depth:]})

    def head(self, model: ModelConfig, params: MTPParams) -> nn.Module:
        return make_head(model, params)

    def example_extras(self, batch: dict[str, Tensor], params: MTPParams) -> dict[str, Tensor]:
        rows = len(batch["input_ids"])
        return {"future_ids": torch.zeros(rows, params.depth, dtype=torch.long, device="meta")}

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, params: MTPParams) -> int:
        """Beside the model's stack: the tied unembedding at every position once a depth and the next
        token's, the heads' blocks; sequential, each module's projection from 2d (and a factorized
        embedding's to d)."""
        b, d, e, tokens = batch_size, model.d_model, model.embedding_size, batch_size * seq_len
        unembedding = lm_head_weights(d, e, model.vocab_size, model.lm_head == "transform")
        flops = (1 + params.depth) * 2 * tokens * unembedding
        flops += stack_forward_flops(b, seq_len, params.depth, d, model.d_ff, model.mlp)
        if params.form == "sequential":
            flops += params.depth * 2 * tokens * (2 * d * d + (e * d if e else 0))
        return flops


IMPLEMENTATION = MultiTokenPrediction()
