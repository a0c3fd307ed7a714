"""One config for every architecture (models/architectures), and named size presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from models.specs.architectures import ARCHITECTURES


@dataclass(frozen=True)
class ModelConfig:
    """A model's shape. The `metadata` of a field holds the bounds params.yaml's `models.<name>.<field>`
    is validated against (lmpipe/params/models.py builds its schema from these fields)."""

    arch: str = "decoder"  # a name of models/architectures' registry
    vocab_size: int = 16000
    d_model: int = field(default=256, metadata={"ge": 8})
    n_layers: int = field(default=4, metadata={"ge": 1})  # encoder layers, or a decoder-only model's
    n_decoder_layers: int | None = field(
        default=None, metadata={"ge": 1}
    )  # encoder-decoder: n_layers if None
    share_encoder_decoder: bool = False  # encoder-decoder: one stack's weights for both (T5's "shared")
    n_heads: int = field(default=4, metadata={"ge": 1})
    d_ff: int = field(default=1024, metadata={"ge": 1})
    max_len: int = field(default=128, metadata={"ge": 8})
    dropout: float = field(default=0.0, metadata={"ge": 0.0, "lt": 1.0})
    mlp: Literal["gelu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    # learned / sinusoidal: added to the embeddings; rope: rotates queries and keys; alibi, relative
    # (T5's bucketed bias): added to the self-attention logits; xl: Transformer-XL's relative attention
    # (the distances' sinusoids through each layer's projection, its u and v biases); none: no
    # position signal (a recurrent stack reads the order itself)
    positions: Literal["learned", "sinusoidal", "rope", "alibi", "relative", "xl", "none"] = "learned"
    # Transformer-XL's segment-level recurrence: each layer also attends to the states that entered it
    # over the last mem_len positions of the previous segments (pretrain.sampling: stream); an
    # encoder's (XLNet's) attends to the whole memory and segment
    mem_len: int = field(
        default=0,
        metadata={
            "ge": 0,
            "description": "Transformer-XL's memory: the states of the previous segments each layer also "
            "attends to (0: none; needs positions: xl on a decoder or, as XLNet's, an encoder, and "
            "pretrain.sampling: stream)",
        },
    )
    # word2vec's CBOW: the tokens each side of a position that predict it
    window: int = field(
        default=5, metadata={"ge": 1, "description": "arch cbow: the context, tokens each side (word2vec: 5)"}
    )
    # BERT's A/B embeddings: a token after the first [SEP] of its row is segment B (pretraining's
    # sentence pairs, fine-tuning's sentence-pair tasks); read from the ids, so no input carries them
    segment_embeddings: bool = False
    # ALBERT's factorized embeddings: tokens (and positions, segments) embedded in E dimensions and
    # projected to d_model; the LM head projects back through the same matrix (V·E + E·d parameters
    # where BERT has V·d). None: E = d_model, no projection
    embedding_size: int | None = field(
        default=None,
        metadata={"ge": 8, "description": "ALBERT's E: embeddings of E dimensions projected to d_model"},
    )
    # ALBERT's cross-layer sharing: a stack's layers in `layer_groups` consecutive groups, the layers of
    # a group sharing all their weights, the attention's (with its norm) or the feed-forward's
    share_layers: Literal["none", "all", "attention", "ffn"] = field(
        default="none", metadata={"description": "ALBERT's cross-layer sharing: whole blocks or one branch"}
    )
    layer_groups: int = field(
        default=1,
        metadata={"ge": 1, "description": "share_layers: groups of consecutive layers, each shared"},
    )
    # the LM head: `tied`, the hidden states times the token embeddings (projected back to E first where
    # factorized); `transform`, BERT's (ALBERT's, RoBERTa's, ELECTRA's generator's): a dense layer to
    # the embeddings' width, GELU and LayerNorm, then the token embeddings and an output bias; `untied`,
    # output vectors of their own (word2vec's, whose input and output vectors differ)
    lm_head: Literal["tied", "transform", "untied"] = field(
        default="tied",
        metadata={
            "description": "tied: hidden × embeddings; transform: BERT's dense, GELU, LayerNorm first, "
            "and an output bias; untied: output vectors of their own (word2vec's)"
        },
    )
    bias: bool = True
    norm_eps: float = field(default=1e-5, metadata={"gt": 0.0})
    init_std: float = field(default=0.02, metadata={"gt": 0.0})
    pad_id: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture '{self.arch}' (one of: {', '.join(ARCHITECTURES)})")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError("rope needs an even head size (d_model / n_heads)")
        if self.mem_len and self.positions != "xl":
            raise ValueError("mem_len: Transformer-XL's memory needs its relative positions, positions: xl")
        spec = ARCHITECTURES[self.arch]
        spec.check_model(self)
        if self.mem_len and (spec.encoder == spec.decoder or spec.prefix):
            raise ValueError(
                f"mem_len: Transformer-XL's memory is a decoder's or (XLNet's) an encoder's, not arch "
                f"{self.arch}'s"
            )
        two_stacks = ARCHITECTURES[self.arch].encoder and ARCHITECTURES[self.arch].decoder
        if self.n_decoder_layers is not None and not two_stacks:
            raise ValueError("n_decoder_layers is for an encoder-decoder only")
        if self.share_encoder_decoder and not two_stacks:
            raise ValueError("share_encoder_decoder is for an encoder-decoder only")
        if self.share_encoder_decoder and self.decoder_layers != self.n_layers:
            raise ValueError("share_encoder_decoder shares one stack: n_decoder_layers must equal n_layers")
        if self.embedding_size is not None and self.embedding_size > self.d_model:
            raise ValueError(
                f"embedding_size: {self.embedding_size} exceeds d_model ({self.d_model}); ALBERT's "
                "factorized embeddings are narrower than the model"
            )
        if self.lm_head == "untied" and self.embedding_size is not None:
            raise ValueError(
                "lm_head: untied has output vectors of d_model; ALBERT's factorized embeddings "
                "(embedding_size) project back through the input matrix: use tied or transform"
            )
        if self.layer_groups > 1 and self.share_layers == "none":
            raise ValueError("layer_groups: groups of shared layers need share_layers all, attention or ffn")
        if self.layer_groups > min(self.n_layers, self.decoder_layers):
            raise ValueError(f"layer_groups: {self.layer_groups} groups exceed the layers of a stack")

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


# Sizes of the papers' models (BERT-base and -large, GPT-1, T5-base) and small ones that train on a CPU.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=128, n_layers=2, n_heads=2, d_ff=512, max_len=128),
    "small": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024, max_len=128),
    "medium": dict(d_model=512, n_layers=8, n_heads=8, d_ff=2048, max_len=512),
    "bert-base": dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=512, norm_position="post"),
    "bert-large": dict(d_model=1024, n_layers=24, n_heads=16, d_ff=4096, max_len=512, norm_position="post"),
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
