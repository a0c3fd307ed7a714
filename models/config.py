"""One config for the three architectures, and named size presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

Arch = Literal["encoder", "decoder", "encoder_decoder"]
Objective = Literal["mlm", "clm", "span"]
# BERT's masked LM, GPT's next token, T5's span corruption: the objective each architecture trains with
OBJECTIVE_OF_ARCH: dict[str, Objective] = {"encoder": "mlm", "decoder": "clm", "encoder_decoder": "span"}


@dataclass(frozen=True)
class ModelConfig:
    arch: Arch = "decoder"
    vocab_size: int = 16000
    d_model: int = 256
    n_layers: int = 4  # encoder layers, or decoder layers of a decoder-only model
    n_decoder_layers: int | None = None  # encoder-decoder only; defaults to n_layers
    n_heads: int = 4
    d_ff: int = 1024
    max_len: int = 128
    dropout: float = 0.0
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    positions: Literal["learned", "sinusoidal", "rope"] = "learned"
    bias: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError("rope needs an even head size (d_model / n_heads)")
        if self.n_decoder_layers is not None and self.arch != "encoder_decoder":
            raise ValueError("n_decoder_layers is for arch=encoder_decoder only")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def with_(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)


# Sizes of the papers' models (BERT-base, GPT-1, T5-base) and small ones that train on a CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=128, n_layers=2, n_heads=2, d_ff=512, max_len=128),
    "small": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_len=128),
    "medium": dict(d_model=512, n_layers=8, n_heads=8, d_ff=2048, max_len=512),
    "bert-base": dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=512, norm_position="post"),
    "gpt1": dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=512, norm_position="post"),
    "t5-base": dict(
        d_model=768,
        n_layers=12,
        n_heads=12,
        d_ff=3072,
        max_len=512,
        norm="rmsnorm",
        bias=False,
        positions="rope",
    ),
}
