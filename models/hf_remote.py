"""transformers classes around our Transformer, for configurations no transformers class computes
exactly (rotary or sinusoidal positions, RMSNorm, SwiGLU, no biases, our encoder-decoder); and the
masked-LM head our encoders train (the hidden states times the word embeddings: no transform, no bias)
on transformers' own BERT and XLM-RoBERTa-XL, whose masked-LM classes add a transform it never trained,
and on XLNet, which has no masked-LM class.

An export writes models/config.py, models/transformer.py and this file, concatenated, as
`modeling_lmpipe.py`: the modules that trained the weights, loaded with
`trust_remote_code=True`. Needs transformers (the `hf` extra).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import (
    BertModel,
    BertPreTrainedModel,
    FillMaskPipeline,
    GPT2Model,
    GPT2PreTrainedModel,
    PretrainedConfig,
    PreTrainedModel,
    XLMRobertaXLModel,
    XLMRobertaXLPreTrainedModel,
    XLNetModel,
    XLNetPreTrainedModel,
)
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

from models.architectures.base import shift_right
from models.architectures.decoder import last_state
from models.architectures.encoder import pooled_states
from models.config import ModelConfig
from models.special import SPECIAL
from models.transformer import Transformer, rope_tables, sinusoidal_table


class LmpipeConfig(PretrainedConfig):
    model_type = "lmpipe"

    def __init__(self, lmpipe: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.lmpipe = dict(lmpipe or {})  # models.config.ModelConfig's fields
        super().__init__(**kwargs)


class LmpipePreTrainedModel(PreTrainedModel):
    config_class = LmpipeConfig
    base_model_prefix = "net"

    def __init__(self, config: LmpipeConfig) -> None:
        super().__init__(config)
        self.net = Transformer(ModelConfig(**config.lmpipe))

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """For what the checkpoint lacks: a new head as ours are initialised; the position tables,
        which are computed, never stored (transformers may build the model on the meta device)."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.net.cfg.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        if isinstance(module, Transformer):
            cfg = module.cfg
            if cfg.positions == "rope":
                cos, sin = rope_tables(cfg.max_len, cfg.head_dim)
                module.rope_cos.copy_(cos)
                module.rope_sin.copy_(sin)
            elif cfg.positions == "sinusoidal":
                module.sinusoid.copy_(sinusoidal_table(cfg.max_len, cfg.embedding_size or cfg.d_model))

    def hidden(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        prefix_lengths: Tensor | None = None,
    ) -> Tensor:
        """The last stack's states; an encoder-decoder without decoder ids runs its decoder on <s>; a
        prefix LM without `prefix_lengths` reads the whole input as its prefix (as fine-tuning does)."""
        pad = None if attention_mask is None else attention_mask.bool()
        decoder_pad = None if decoder_attention_mask is None else decoder_attention_mask.bool()
        if self.net.arch.encoder and self.net.arch.decoder and decoder_input_ids is None:
            decoder_input_ids = torch.full_like(input_ids[:, :1], SPECIAL.bos)
        if self.net.arch.prefix and prefix_lengths is None:
            real = torch.ones_like(input_ids, dtype=torch.bool) if pad is None else pad
            prefix_lengths = real.long().sum(1)
        return self.net(input_ids, pad, decoder_input_ids, decoder_pad, prefix_lengths)


class LmpipeModel(LmpipePreTrainedModel):
    def __init__(self, config: LmpipeConfig) -> None:
        super().__init__(config)
        self.post_init()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any
    ) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self.hidden(input_ids, attention_mask, *_decoder(kwargs)))


class LmpipeForLM(LmpipePreTrainedModel):
    """Logits over the vocabulary through the tied embeddings, as in pretraining. `labels` (-100:
    ignored) are the targets of each position: a decoder's are its inputs shifted by one, an
    encoder-decoder's are the decoder's targets (its inputs are <s> and the labels shifted right)."""

    def __init__(self, config: LmpipeConfig) -> None:
        super().__init__(config)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        decoder_ids, decoder_mask, prefix_lengths = _decoder(kwargs)
        if decoder_ids is None and labels is not None and self.net.arch.encoder and self.net.arch.decoder:
            decoder_ids = shift_right(labels.clamp(min=0))
        logits = self.net.lm_logits(
            self.hidden(input_ids, attention_mask, decoder_ids, decoder_mask, prefix_lengths)
        )
        loss = None
        if labels is not None:
            scored, targets = logits, labels
            if not self.net.arch.encoder:  # a decoder-only LM: each position's label is the next input
                scored, targets = logits[:, :-1], labels[:, 1:]
            loss = F.cross_entropy(scored.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)


class LmpipeForSequenceClassification(LmpipePreTrainedModel):
    """Our fine-tuning's head: the pooling it trained with (`pooling` in the config, else the
    architecture's default, its first), dropout and a linear `score`; regression when num_labels is 1."""

    def __init__(self, config: LmpipeConfig, pooling: str | None = None) -> None:
        super().__init__(config)
        if pooling is not None:  # from_pretrained(..., pooling=...): a fine-tune's other than the default
            config.pooling = pooling
        self.drop = nn.Dropout(0.1)
        self.score = nn.Linear(self.net.arch.pooled_size(self.net.cfg), config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        mask = real_tokens(input_ids, attention_mask)
        pooling = getattr(self.config, "pooling", None) or self.net.arch.poolings[0]
        pooled = self.net.arch.pooled(self.net, input_ids, mask, pooling)
        return _classified(self.score(self.drop(pooled)), labels, self.config.num_labels)


def real_tokens(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The pad mask our models take (True on real tokens) from transformers' attention mask."""
    return torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()


def _classified(logits: Tensor, labels: Tensor | None, num_labels: int) -> SequenceClassifierOutput:
    loss = None
    if labels is not None:
        if num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
        else:
            loss = F.cross_entropy(logits, labels.long())
    return SequenceClassifierOutput(loss=loss, logits=logits)


class _PooledClassification:
    """Our fine-tuning's head on a native backbone: the pooling it trained with (`pooling` in the
    config, or given to from_pretrained, else the architecture's default), dropout and a linear
    `score`; what peft loads a LoRA fine-tune's adapter onto (models/peft_export.py). transformers' own
    classification classes put a pooler (BERT's, RoBERTa's dense and tanh) or a summary ours never
    trained before their head."""

    default_pooling: str
    backbone: tuple[str, Any]  # the attribute transformers loads the backbone's weights into, its class

    def __init__(self, config: Any, pooling: str | None = None) -> None:
        super().__init__(config)
        if pooling is not None:  # a fine-tune's other than the default
            config.pooling = pooling
        attribute, backbone = self.backbone
        kwargs = {} if backbone is GPT2Model else {"add_pooling_layer": False}
        setattr(self, attribute, backbone(config, **kwargs))
        self.drop = nn.Dropout(0.1)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        mask = real_tokens(input_ids, attention_mask)
        states = self.base_model(input_ids, attention_mask=mask.long()).last_hidden_state
        pooling = getattr(self.config, "pooling", None) or self.default_pooling
        if pooling == "cls":
            pooled = states[:, 0]
        elif pooling == "last":
            pooled = last_state(states, mask)
        else:
            pooled = pooled_states(states, mask, pooling)
        return _classified(self.score(self.drop(pooled)), labels, self.config.num_labels)


class BertForPooledClassification(_PooledClassification, BertPreTrainedModel):
    """BertModel (our post-norm encoder) with our fine-tuning's head."""

    default_pooling, backbone = "cls", ("bert", BertModel)


class XLMRobertaXLForPooledClassification(_PooledClassification, XLMRobertaXLPreTrainedModel):
    """XLMRobertaXLModel (our pre-norm encoder) with our fine-tuning's head."""

    default_pooling, backbone = "cls", ("roberta", XLMRobertaXLModel)


class GPT2ForPooledClassification(_PooledClassification, GPT2PreTrainedModel):
    """GPT2Model (our pre-norm decoder) with our fine-tuning's head: the last real token's state."""

    default_pooling, backbone = "last", ("transformer", GPT2Model)


def _masked_lm_output(logits: Tensor, labels: Tensor | None) -> MaskedLMOutput:
    loss = None
    if labels is not None:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
    return MaskedLMOutput(loss=loss, logits=logits)


class _TiedMaskedLM:
    """The masked-LM logits our encoders trained: the backbone's hidden states times its word
    embeddings (transformers' masked-LM heads add a dense layer, GELU, LayerNorm and a bias)."""

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        backbone = self.base_model
        hidden = backbone(input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        return _masked_lm_output(F.linear(hidden, backbone.get_input_embeddings().weight), labels)


class BertForTiedMaskedLM(_TiedMaskedLM, BertPreTrainedModel):
    """BertModel (our post-norm encoder) with the masked-LM head it trained."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.post_init()


class XLMRobertaXLForTiedMaskedLM(_TiedMaskedLM, XLMRobertaXLPreTrainedModel):
    """XLMRobertaXLModel (our pre-norm encoder) with the masked-LM head it trained."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.roberta = XLMRobertaXLModel(config, add_pooling_layer=False)
        self.post_init()


class XLNetForTiedMaskedLM(_TiedMaskedLM, XLNetPreTrainedModel):
    """XLNetModel (our post-norm encoder with Transformer-XL's relative attention) with the masked-LM
    head it trained."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.transformer = XLNetModel(config)
        self.post_init()


class LmpipeFillMaskPipeline(FillMaskPipeline):
    """transformers' fill-mask pipeline, registered in an encoder export's `custom_pipelines`: so that
    `pipeline("fill-mask", model=path)` asks for `trust_remote_code=True` (and then uses the trained
    head above) instead of building the native class's untrained one."""


def _decoder(kwargs: dict[str, Any]) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    return kwargs.get("decoder_input_ids"), kwargs.get("decoder_attention_mask"), kwargs.get("prefix_lengths")
