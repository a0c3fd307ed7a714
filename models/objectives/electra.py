"""ELECTRA's replaced-token detection (Clark et al., 2020). A small generator, a masked LM that shares
the discriminator's embeddings, predicts the masked tokens and fills their places with samples from
its softmax (no gradient through the samples); the discriminator, the model itself (what fine-tunes
and exports), labels every real token original or replaced. The step minimises the generator's
masked-LM loss plus 50 × the discriminator's loss over all tokens: it learns from every token, not
from the 15 % that are masked. As google-research/electra: [MASK] at 85 % of the selected tokens, the
rest kept (no random tokens); a token counts as replaced only where the sample differs from it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import Tensor, nn

from models.config import ModelConfig
from models.objectives.base import NO_PIECES, ObjectiveImplementation, Pieces, Terms
from models.objectives.mlm import mask_tokens
from models.pair import Pair
from models.specs.objectives.electra import ElectraParams
from models.stack_flops import lm_head_weights, stack_forward_flops
from models.transformer import Stack, Transformer, init_normal, rope_tables


def generator_config(model: ModelConfig, width: float) -> ModelConfig:
    """The generator's shape: the discriminator's depth, its width, heads and MLP times `width` (the
    head size even, so rotary positions fit); its own stack, no sharing; its embeddings are the
    discriminator's (E wide, projected to its width: as ELECTRA's, normalised where post-LN)."""
    heads = max(1, round(model.n_heads * width))
    d_model = max(2 * heads, round(model.d_model * width / (2 * heads)) * 2 * heads)
    return model.with_(
        d_model=d_model,
        n_heads=heads,
        d_ff=max(1, round(model.d_ff * width)),
        embedding_size=None,
        share_layers="none",
        layer_groups=1,
        segment_embeddings=False,
    )


def detector_head(d_model: int, init_std: float) -> nn.Module:
    """ELECTRA's discriminator head: a dense layer, GELU and one logit a token (replaced or not)."""

    head = torch.nn.Sequential(
        torch.nn.Linear(d_model, d_model), torch.nn.GELU(), torch.nn.Linear(d_model, 1)
    )
    return head.apply(lambda module: init_normal(module, init_std))


def replace_tokens(
    ids: Tensor, positions: Tensor, labels: Tensor, logits: Tensor, uniforms: Tensor
) -> tuple[Tensor, Tensor]:
    """The discriminator's input and its labels: at each masked position (flat index) a sample from the
    generator's softmax, drawn by inverse CDF with that position's uniform from the batch (so seeded
    and resumable, with no gradient through it); replaced (1.0) where the sample differs from the
    original token, original (0.0) everywhere else."""
    with torch.no_grad():
        cdf = logits.detach().float().softmax(-1).cumsum(-1)
        targets = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]  # the sum's rounding: never past the end
        sampled = torch.searchsorted(cdf, targets).squeeze(1).clamp(max=logits.shape[-1] - 1)
    flat = ids.reshape(-1)
    fake = flat.index_copy(0, positions, sampled).view_as(ids)
    differs = (sampled != labels).float()
    replaced = torch.zeros(flat.shape, dtype=torch.float32, device=flat.device).index_copy(
        0, positions, differs
    )
    return fake, replaced


def collapse_measures(
    scores: Tensor, replaced: Tensor, hidden: Tensor, pad_mask: Tensor | None
) -> dict[str, Tensor]:
    """What shows a discriminator's collapse (docs/results/2026-11.md): the ROC AUC of its scores on
    the real tokens (0.5 at chance; scikit-learn's, on the host: validation only), and the mean cosine
    between two positions' final states in a row (near 1 when every state is one vector)."""
    real = torch.ones_like(replaced, dtype=torch.bool) if pad_mask is None else pad_mask.reshape(-1)
    labels, ranked = replaced[real].cpu().numpy(), scores[real].detach().float().cpu().numpy()
    both = 0 < labels.sum() < len(labels)
    auc = torch.tensor(roc_auc_score(labels, ranked) if both else 0.5, device=scores.device)
    mask = torch.ones(hidden.shape[:2], device=hidden.device) if pad_mask is None else pad_mask.float()
    units = F.normalize(hidden.detach().float(), dim=-1) * mask[..., None]
    n = mask.sum(1)
    pairs = (units.sum(1).pow(2).sum(-1) - n) / (n * (n - 1)).clamp(min=1.0)
    return {"replaced_auc": auc, "state_cosine": pairs.mean()}


def make_head(model: ModelConfig, params: ElectraParams) -> nn.Module:
    """The generator and the discriminator's head, trained beside the model (the discriminator)."""

    class Generator(torch.nn.Module):
        """A masked LM on the discriminator's embeddings (and their norm, post-LN) projected to its
        width, its own stack, its predictions tied to the shared token embeddings: through ELECTRA's
        prediction head, or back through the input projection's matrix."""

        def __init__(self) -> None:
            super().__init__()
            self.cfg = generator_config(model, params.generator_width)
            width = model.embedding_size or model.d_model
            self.projection = torch.nn.Linear(width, self.cfg.d_model, bias=model.bias)
            self.stack = Stack(self.cfg, model.n_layers, causal=False, cross=False, projected=True)
            self.drop = torch.nn.Dropout(model.dropout)
            self.transform, self.bias = None, None
            if params.generator_head == "transform":
                self.transform = torch.nn.Sequential(
                    torch.nn.Linear(self.cfg.d_model, width),
                    torch.nn.GELU(),
                    torch.nn.LayerNorm(width, eps=model.norm_eps),
                )
                self.bias = torch.nn.Parameter(torch.zeros(model.vocab_size))
            if model.positions == "rope":
                cos, sin = rope_tables(model.max_len, self.cfg.head_dim)
                self.register_buffer("rope_cos", cos, persistent=False)
                self.register_buffer("rope_sin", sin, persistent=False)
            self.apply(lambda module: init_normal(module, model.init_std))

        def forward(
            self, discriminator: Transformer, ids: Tensor, pad_mask: Tensor | None, positions: Tensor
        ) -> Tensor:
            """Logits over the vocabulary at `positions` (flat indices into the batch)."""
            rope = (self.rope_cos, self.rope_sin) if model.positions == "rope" else None
            embedded, norm = discriminator.embeddings(ids), discriminator.embedding_norm()
            embedded = self.drop(embedded if norm is None else norm(embedded))
            states = self.stack(self.projection(embedded), pad_mask, rope)
            picked = states.reshape(-1, self.cfg.d_model).index_select(0, positions)
            if self.transform is not None:
                return F.linear(self.transform(picked), discriminator.embed.weight, self.bias)
            return F.linear(picked @ self.projection.weight, discriminator.embed.weight)

    class ElectraHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator = Generator()
            self.detector = detector_head(model.d_model, model.init_std)
            self.weight = params.discriminator_weight

        def forward(self, discriminator: Transformer, batch: dict[str, Tensor]) -> Terms:
            ids, positions, labels = batch["input_ids"], batch["positions"], batch["labels"]
            pad_mask = batch.get("pad_mask")
            logits = self.generator(discriminator, ids, pad_mask, positions)
            loss = F.cross_entropy(logits.float(), labels)
            correct = (logits.argmax(-1) == labels).sum()
            fake, replaced = replace_tokens(ids, positions, labels, logits, batch["sample_uniforms"])
            hidden = discriminator(fake, pad_mask, prefix_lengths=batch.get("prefix_lengths"))
            scores = self.detector(hidden).float().reshape(-1)
            weights = torch.ones_like(replaced) if pad_mask is None else pad_mask.reshape(-1).float()
            detection = F.binary_cross_entropy_with_logits(scores, replaced, weight=weights, reduction="sum")
            detection = detection / weights.sum()
            detected = (scores > 0).float()
            accuracy = ((detected == replaced).float() * weights).sum() / weights.sum()
            # at its prior the discriminator labels every token original: accuracy 1 - share, recall 0
            share = (replaced * weights).sum() / weights.sum()
            recall = (detected * replaced).sum() / replaced.sum().clamp(min=1.0)
            terms = {"replaced": (detection, self.weight)}
            rates = {"replaced_share": share, "replaced_recall": recall}
            if not self.training:  # validation: the collapse shows in MLflow
                rates |= collapse_measures(scores, replaced, hidden, pad_mask)
            return Terms(loss, correct, labels.numel(), terms, {"replaced": accuracy}, rates)

    return ElectraHead()


class Electra(ObjectiveImplementation):
    def pair(
        self,
        rows: Tensor,
        params: ElectraParams,
        generator: torch.Generator,
        vocab_size: int,
        pieces: Pieces = NO_PIECES,
    ) -> Pair:
        masked = mask_tokens(rows, generator, vocab_size, params.mask_rate, params.mask_fraction, 0.0)
        # one uniform a selected token, in the order of its flat position: the generator's sample there
        uniforms = torch.rand(masked.positions.shape, generator=generator)
        return Pair(masked.input_ids, rows, noise=masked.selected, extras={"sample_uniforms": uniforms})

    def head(self, model: ModelConfig, params: ElectraParams) -> nn.Module:
        return make_head(model, params)

    def example_extras(self, batch: dict[str, Tensor], params: ElectraParams) -> dict[str, Tensor]:
        return {"sample_uniforms": torch.zeros(len(batch["labels"]), device="meta")}

    def head_flops(self, model: ModelConfig, batch_size: int, seq_len: int, params: ElectraParams) -> int:
        """The generator (its projection, stack and tied LM head at the masked tokens) and the
        discriminator's head on every token."""

        gen, b, e = (
            generator_config(model, params.generator_width),
            batch_size,
            model.embedding_size or model.d_model,
        )
        predicted = round(params.mask_rate * seq_len * b)
        flops = 2 * b * seq_len * e * gen.d_model + stack_forward_flops(
            b, seq_len, model.n_layers, gen.d_model, gen.d_ff, gen.mlp
        )
        flops += (
            2
            * predicted
            * lm_head_weights(gen.d_model, e, model.vocab_size, params.generator_head == "transform")
        )
        return flops + 2 * b * seq_len * (model.d_model * model.d_model + model.d_model)


IMPLEMENTATION = Electra()
