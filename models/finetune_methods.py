"""The ways to fine-tune a pretrained model (`finetune.method`), each on a backbone whose own weights
are frozen: what it adds, and what then trains.

- `frozen`: nothing added; the head (and the weights the architecture leaves to a task, ELMo's scalar
  mix) on the fixed features (ELMo's use of a biLM).
- `lora` (Hu et al., 2021), through `peft`: W x + (α/r)·B A x on the chosen linear layers, A and B
  trained (B starts at zero, so the model starts as the pretrained one).
- `houlsby` (Houlsby et al., 2019): a bottleneck adapter, y + U swish(D y), on the output of each
  block's attention and of its MLP, before the residual sum; U starts at zero.
- `pfeiffer` (Pfeiffer et al., 2021): the adapter on the MLP's output alone, with ReLU (the
  activations of the code behind the LoRA paper's adapter rows, microsoft/AdaMix's).
- `adamix` (Wang et al., 2022): one adapter on each MLP's output, y + U gelu(D y), a mixture of
  `experts` down projections (and up projections, unless `share_up`, AdaMix's default): every forward
  pass in training routes through one of each drawn at random, inference through the mean of their
  weights, as microsoft/AdaMix's ExpertSoup.
- `prefix` (Li & Liang, 2021): `length` trained keys and values before the sequence's in every
  self-attention, made by an MLP from a `length` × d table (the paper's reparameterisation).
- `prompt` (Lester et al., 2021): `length` trained vectors before the input's embeddings, initialised
  from the embeddings of tokens drawn from the vocabulary; their states are dropped at the stack's
  output, so that the pooling reads the input's.

Every method but `frozen` adds to transformer blocks; the params' validation keeps each to the models
it fits (lmpipe/params/finetune.py).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.special import SPECIAL
from models.transformer import Block, Stack, Transformer

# the modules LoRA adapts, by `finetune.methods.lora.targets`: the self-attention's input projections
# (fused q, k, v; q and k, v apart where Transformer-XL's attention keeps them so), its output
# projection, the MLP's two layers
LORA_TARGETS = {
    "attention": r"self_attn\.(qkv|q|kv)",
    "attention_out": r"self_attn\.out",
    "mlp": r"mlp\.(up|down)",
}


class Adapter(nn.Module):
    """A bottleneck adapter: y + U f(D y), the identity at initialisation (U = 0)."""

    def __init__(self, width: int, bottleneck: int, activation: Any, std: float = 0.01) -> None:
        super().__init__()
        self.down = nn.Linear(width, bottleneck)
        self.up = nn.Linear(bottleneck, width)
        self.activation = activation
        nn.init.normal_(self.down.weight, std=std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, y: Tensor) -> Tensor:
        return y + self.up(self.activation(self.down(y)))


class MixtureAdapter(nn.Module):
    """AdaMix's adapter: `experts` down projections and as many up projections, or one shared
    (`share_up`); in training one of each, drawn at random every forward pass (from torch's generator,
    which the loop seeds every step), in evaluation the mean of their weights (the paper's merging:
    one adapter's cost at inference)."""

    def __init__(self, width: int, bottleneck: int, experts: int, share_up: bool, std: float = 0.01) -> None:
        super().__init__()
        ups = 1 if share_up else experts
        self.down = nn.Parameter(torch.randn(experts, bottleneck, width) * std)
        self.up = nn.Parameter(torch.zeros(ups, width, bottleneck))
        # the biases one vector each, so that AdamW's groups leave them undecayed as every bias
        self.down_bias = nn.ParameterList(torch.zeros(bottleneck) for _ in range(experts))
        self.up_bias = nn.ParameterList(torch.zeros(width) for _ in range(ups))

    def forward(self, y: Tensor) -> Tensor:
        if self.training:
            down, up = torch.randint(len(self.down), ()).item(), torch.randint(len(self.up), ()).item()
            weights = (self.down[down], self.down_bias[down], self.up[up], self.up_bias[up])
        else:
            weights = (
                self.down.mean(0),
                torch.stack(list(self.down_bias)).mean(0),
                self.up.mean(0),
                torch.stack(list(self.up_bias)).mean(0),
            )
        return y + F.linear(F.gelu(F.linear(y, weights[0], weights[1])), weights[2], weights[3])


def _after(adapter: nn.Module, module: nn.Module, args: Any, output: Tensor) -> Tensor:
    return adapter(output)


def add_adapters(model: Transformer, make: Any, branches: tuple[str, ...]) -> None:
    """An adapter from `make()` on the output of each block's `branches` (`self_attn`, `mlp`), kept on
    the block as `<branch>_adapter` and run by a forward hook: the block's own code is unchanged."""
    for block in blocks(model):
        for branch in branches:
            adapter = make()
            setattr(block, f"{branch}_adapter", adapter)
            getattr(block, branch).register_forward_hook(partial(_after, adapter))


class PrefixEncoder(nn.Module):
    """Li & Liang's prefixes: a `length` × d table through an MLP (d → hidden → 2·L·d, tanh) gives each
    of the L self-attentions its `length` keys and values."""

    def __init__(self, length: int, n_layers: int, d_model: int, hidden: int, std: float) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(length, d_model) * std)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, hidden), nn.Tanh(), nn.Linear(hidden, 2 * n_layers * d_model)
        )
        self.d_model = d_model

    def keys_values(
        self, layer: int, n_heads: int, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Layer `layer`'s prefix before the keys and values [B, H, T, h], and the attention mask that
        lets every query see it (None where nothing else is masked)."""
        rows = slice(2 * layer * self.d_model, 2 * (layer + 1) * self.d_model)
        out = self.mlp[-1]
        made = F.linear(self.mlp[:-1](self.table), out.weight[rows], out.bias[rows])  # [P, 2d]
        length, batch = made.shape[0], k.shape[0]
        prefix_k, prefix_v = (
            part.view(length, n_heads, -1).transpose(0, 1).expand(batch, -1, -1, -1).to(k.dtype)
            for part in made.chunk(2, dim=-1)
        )
        if mask is None and causal:
            queries = k.shape[2]
            mask = torch.ones(queries, queries, dtype=torch.bool, device=k.device).tril()
        if mask is not None:
            mask = F.pad(mask, (length, 0), value=0.0 if mask.is_floating_point() else True)
        return torch.cat([prefix_k, k], dim=2), torch.cat([prefix_v, v], dim=2), mask


def add_prefixes(model: Transformer, length: int, hidden: int) -> None:
    """A prefix before every self-attention's keys and values (cross-attention reads the encoder)."""
    layers = blocks(model)
    encoder = PrefixEncoder(length, len(layers), model.cfg.d_model, hidden, model.cfg.init_std)
    model.prefix_encoder = encoder
    for i, block in enumerate(layers):
        block.self_attn.prefix = partial(encoder.keys_values, i, model.cfg.n_heads)


class Prompt(nn.Module):
    """Lester et al.'s soft prompt: `length` vectors before a stack's input, its states at their
    positions dropped from the output."""

    def __init__(self, vectors: Tensor) -> None:
        super().__init__()
        self.vectors = nn.Parameter(vectors)

    def prepend(self, stack: Stack, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = inspect.signature(Stack.forward).bind(stack, *args, **kwargs)
        x, pad_mask, prefix = (bound.arguments.get(k) for k in ("x", "pad_mask", "prefix_lengths"))
        length = len(self.vectors)
        bound.arguments["x"] = torch.cat([self.vectors.to(x.dtype).expand(len(x), -1, -1), x], dim=1)
        if pad_mask is not None:
            bound.arguments["pad_mask"] = F.pad(pad_mask, (length, 0), value=True)
        if prefix is not None:  # a prefix LM's prompt is in the prefix, read both ways
            bound.arguments["prefix_lengths"] = prefix + length
        return bound.args[1:], bound.kwargs

    def drop(self, stack: Stack, args: tuple, kwargs: dict, output: Tensor) -> Tensor:
        return output[:, len(self.vectors) :]


def add_prompt(model: Transformer, length: int, generator: torch.Generator) -> None:
    """A soft prompt before the input of the stack the task reads first (the encoder, if any), from
    the embeddings of tokens drawn among the 5,000 first pieces after the specials (Lester et al.'s:
    among the 5,000 most common; SentencePiece orders its pieces by score)."""
    first = SPECIAL.n_special
    ids = torch.randint(first, min(first + 5000, model.cfg.vocab_size), (length,), generator=generator)
    with torch.no_grad():
        vectors = model.embed(ids.to(model.embed.weight.device))
        if model.embed_projection is not None:
            vectors = model.embed_projection(vectors)
    stack = model.encoder if model.encoder is not None else model.decoder
    stack.prompt = Prompt(vectors.clone())
    stack.register_forward_pre_hook(stack.prompt.prepend, with_kwargs=True)
    stack.register_forward_hook(stack.prompt.drop, with_kwargs=True)


def blocks(model: Transformer) -> list[Block]:
    """The model's transformer blocks, self-attention first (the encoder's, then the decoder's)."""
    return [module for module in model.modules() if isinstance(module, Block)]


def apply_method(model: Transformer, method: str, options: dict[str, Any], seed: int) -> None:
    """Add `method`'s weights to a backbone whose own weights are frozen (seeded: the same adapters
    for the same seed); `options`: its params (lmpipe/params/finetune.py)."""
    width = model.cfg.d_model
    if method == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        targets = "|".join(LORA_TARGETS[t] for t in options["targets"])
        config = LoraConfig(
            r=options["rank"],
            lora_alpha=options["alpha"],
            lora_dropout=options["dropout"],
            target_modules=rf".*\.({targets})",
        )
        inject_adapter_in_model(config, model)
    elif method == "houlsby":
        add_adapters(model, lambda: Adapter(width, options["bottleneck"], F.silu), ("self_attn", "mlp"))
    elif method == "pfeiffer":
        add_adapters(model, lambda: Adapter(width, options["bottleneck"], F.relu), ("mlp",))
    elif method == "adamix":
        experts, share_up = options["experts"], options["share_up"]
        add_adapters(model, lambda: MixtureAdapter(width, options["bottleneck"], experts, share_up), ("mlp",))
    elif method == "prefix":
        add_prefixes(model, options["length"], options["hidden"])
    elif method == "prompt":
        add_prompt(model, options["length"], torch.Generator().manual_seed(seed))
    elif method not in ("full", "frozen"):
        raise ValueError(f"no fine-tuning method '{method}'")


def parameter_counts(module: nn.Module) -> tuple[int, int]:
    """(trained, total) parameters of a model: what a method trains, of everything it computes with."""
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return trained, sum(p.numel() for p in module.parameters())
