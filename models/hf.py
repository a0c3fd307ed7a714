"""Our Transformer in the layout of a transformers class: the config.json and the state dict it loads.

A class is used only where it computes exactly what ours does (the same norms in the same places,
activation, positions and biases); every other configuration gets the remote-code class of
models/hf_remote.py, which runs our own modules. No transformers import here: writing an export does
not need it, loading one does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from models.hf_classes import native_class
from models.special import SPECIAL
from models.transformer import Transformer

# the models/ modules whose source goes into the remote-code modeling file (lmpipe/codedeps.py counts
# them as code of every stage that imports this module), and, through `remote_modules`, every
# registered architecture's declaration and implementation
READS_SOURCE_OF = (
    "models.special",
    "models.pair",
    "models.specs.architectures.base",
    "models.specs.architectures",
    "models.architectures.base",
    "models.architectures",
    "models.config",
    "models.transformer",
    "models.hf_remote",
)


def remote_modules() -> list[str]:
    """The modules of the remote-code file in an order that defines each name before its use: the
    declarations' base, each registered architecture's declaration, the implementations' base, each
    implementation (in the registry's order: a later one may build on an earlier one), the model."""
    from models.specs.architectures import ARCHITECTURES

    declared = [type(spec).__module__ for spec in ARCHITECTURES.values()]
    implemented = [spec.implementation for spec in ARCHITECTURES.values()]
    core = list(READS_SOURCE_OF)
    at_declarations, at_implementations = (
        core.index("models.specs.architectures"),
        core.index("models.architectures"),
    )
    return [
        *core[:at_declarations],
        *declared,
        *core[at_declarations:at_implementations],
        *implemented,
        *core[at_implementations:],
    ]


@dataclass(frozen=True)
class HFLayout:
    architecture: str  # the transformers class (or the remote-code class) that loads it
    config: dict[str, Any]  # config.json
    tensors: dict[str, Tensor]  # model.safetensors
    why: str  # for the export's README


def without_lm_head(layout: HFLayout, objective: str) -> HFLayout:
    """The layout of a model whose objective never trained its tied LM head (ELECTRA's discriminator):
    no LM class and no fill-mask pipeline, only the backbone and the sequence classifier."""
    config = {key: value for key, value in layout.config.items() if key != "custom_pipelines"}
    lm_classes = ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM")
    auto_map = {key: value for key, value in config.pop("auto_map", {}).items() if key not in lm_classes}
    if auto_map:
        config["auto_map"] = auto_map
    why = f"{layout.why}; its LM head was never trained (objective {objective}): load the backbone"
    return replace(layout, config=config, why=why)


# what makes `pipeline("fill-mask", model=path)` use an encoder's trained head (models/hf_remote.py)
FILL_MASK = {
    "fill-mask": {
        "impl": "modeling_lmpipe.LmpipeFillMaskPipeline",
        "pt": ["AutoModelForMaskedLM"],
        "type": "text",
    }
}


def _tied_masked_lm(class_name: str, classification: str | None = None) -> dict[str, Any]:
    """A native encoder's masked-LM class: the remote one of models/hf_remote.py that has the head ours
    trained, and the fill-mask pipeline that loads it; and its sequence classifier (`_classifier`), where
    it has one of ours."""
    masked_lm = {"AutoModelForMaskedLM": f"modeling_lmpipe.{class_name}"}
    classifier = _classifier(classification) if classification else {}
    return {"auto_map": masked_lm | classifier, "custom_pipelines": FILL_MASK}


def _classifier(class_name: str) -> dict[str, str]:
    """A native backbone's AutoModelForSequenceClassification: the remote class with our fine-tuning's
    head (pooling, dropout, a linear `score`), which a LoRA fine-tune's peft adapter loads onto."""
    return {"AutoModelForSequenceClassification": f"modeling_lmpipe.{class_name}"}


def _common(model: Transformer) -> dict[str, Any]:
    cfg = model.cfg
    return {
        "vocab_size": cfg.vocab_size,
        "initializer_range": cfg.init_std,
        "pad_token_id": SPECIAL.pad,
        "bos_token_id": SPECIAL.bos,
        "eos_token_id": SPECIAL.eos,
        "tie_word_embeddings": True,
    }


def _gpt2(model: Transformer) -> HFLayout:
    cfg, state = model.cfg, model.state_dict()
    tensors = {
        "transformer.wte.weight": state["embed.weight"],
        "transformer.wpe.weight": state["positions.weight"],
    }
    renames = {  # GPT-2's Conv1D keeps weights as [in, out]: ours transposed
        "norm1": "ln_1",
        "self_attn.qkv": "attn.c_attn",
        "self_attn.out": "attn.c_proj",
        "norm2": "ln_2",
        "mlp.up": "mlp.c_fc",
        "mlp.down": "mlp.c_proj",
    }
    for i in range(cfg.n_layers):
        for ours, theirs in renames.items():
            weight, bias = (
                state[f"decoder.blocks.{i}.{ours}.weight"],
                state[f"decoder.blocks.{i}.{ours}.bias"],
            )
            tensors[f"transformer.h.{i}.{theirs}.weight"] = weight if ours.startswith("norm") else weight.T
            tensors[f"transformer.h.{i}.{theirs}.bias"] = bias
    tensors["transformer.ln_f.weight"] = state["decoder.edge_norm.weight"]
    tensors["transformer.ln_f.bias"] = state["decoder.edge_norm.bias"]
    config = _common(model) | {
        "model_type": "gpt2",
        "n_positions": cfg.max_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff,
        "activation_function": "gelu",  # the exact (erf) GELU, as ours; GPT-2's own is gelu_new
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
    }
    config["auto_map"] = _classifier("GPT2ForPooledClassification")
    why = "a pre-norm decoder with learned positions, LayerNorm, GELU and biases is GPT-2 exactly"
    return HFLayout("GPT2LMHeadModel", config, tensors, why)


def _encoder_layers(stack: nn.Module, pre_norm: bool) -> dict[str, Tensor]:
    """A stack's layers in BERT's names (query/key/value apart); the norms where BERT or XLM-R XL has
    them."""
    state, tensors = stack.state_dict(), {}
    for i in range(len(stack.blocks)):
        ours, theirs = f"blocks.{i}", f"encoder.layer.{i}"
        for kind in ("weight", "bias"):
            parts = state[f"{ours}.self_attn.qkv.{kind}"].chunk(3, dim=0)
            for name, part in zip(("query", "key", "value"), parts, strict=True):
                tensors[f"{theirs}.attention.self.{name}.{kind}"] = part
            tensors[f"{theirs}.attention.output.dense.{kind}"] = state[f"{ours}.self_attn.out.{kind}"]
            tensors[f"{theirs}.intermediate.dense.{kind}"] = state[f"{ours}.mlp.up.{kind}"]
            tensors[f"{theirs}.output.dense.{kind}"] = state[f"{ours}.mlp.down.{kind}"]
            if pre_norm:
                tensors[f"{theirs}.attention.self_attn_layer_norm.{kind}"] = state[f"{ours}.norm1.{kind}"]
                tensors[f"{theirs}.LayerNorm.{kind}"] = state[f"{ours}.norm2.{kind}"]
            else:
                tensors[f"{theirs}.attention.output.LayerNorm.{kind}"] = state[f"{ours}.norm1.{kind}"]
                tensors[f"{theirs}.output.LayerNorm.{kind}"] = state[f"{ours}.norm2.{kind}"]
    return tensors


def _embeddings(model: Transformer, positions: Tensor) -> dict[str, Tensor]:
    """BERT-family embeddings: ours, a position table in the class's numbering, one all-zero type."""
    return {
        "embeddings.word_embeddings.weight": model.embed.weight,
        "embeddings.position_embeddings.weight": positions,
        "embeddings.token_type_embeddings.weight": torch.zeros(1, model.cfg.d_model),
    }


def _encoder_config(model: Transformer, positions: int) -> dict[str, Any]:
    cfg = model.cfg
    return _common(model) | {
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
        "max_position_embeddings": positions,
        "type_vocab_size": 1,  # no segment embeddings: one all-zero type
        "layer_norm_eps": cfg.norm_eps,
    }


def _bert(model: Transformer) -> HFLayout:
    cfg, state = model.cfg, model.state_dict()
    tensors = _embeddings(model, state["positions.weight"])
    tensors["embeddings.LayerNorm.weight"] = state["encoder.edge_norm.weight"]
    tensors["embeddings.LayerNorm.bias"] = state["encoder.edge_norm.bias"]
    tensors |= _encoder_layers(model.encoder, pre_norm=False)
    config = _encoder_config(model, cfg.max_len) | {"model_type": "bert"}
    config |= _tied_masked_lm("BertForTiedMaskedLM", "BertForPooledClassification")
    why = (
        "a post-norm encoder with learned positions, LayerNorm on the embeddings, GELU and biases is "
        "BERT exactly (BertModel: hidden states; BertForMaskedLM's head has a transform ours lacks, so "
        "the masked-LM class is the remote BertForTiedMaskedLM: the hidden states times the word embeddings)"
    )
    return HFLayout("BertModel", config, tensors, why)


def _bert_for_masked_lm(model: Transformer) -> HFLayout:
    """BERT with its own prediction head (`lm_head: transform`): BertForMaskedLM exactly."""
    bert = _bert(model)
    tensors = {f"bert.{key}": value for key, value in bert.tensors.items()}
    tensors |= lm_transform_tensors(model, "cls.predictions")
    config = {key: value for key, value in bert.config.items() if key not in ("auto_map", "custom_pipelines")}
    config["auto_map"] = _classifier("BertForPooledClassification")
    why = (
        "a post-norm encoder with learned positions, LayerNorm on the embeddings, GELU and biases, and "
        "BERT's prediction head (dense, GELU, LayerNorm, output bias), is BertForMaskedLM exactly"
    )
    return HFLayout("BertForMaskedLM", config, tensors, why)


def lm_transform_tensors(model: Transformer, prefix: str) -> dict[str, Tensor]:
    """BERT's prediction head in its names under `prefix` (cls.predictions): the transform and the bias;
    its decoder is the word embeddings (tied)."""
    dense, _, norm = model.lm_transform
    return {
        f"{prefix}.transform.dense.weight": dense.weight,
        f"{prefix}.transform.dense.bias": dense.bias,
        f"{prefix}.transform.LayerNorm.weight": norm.weight,
        f"{prefix}.transform.LayerNorm.bias": norm.bias,
        f"{prefix}.bias": model.lm_bias,
    }


def _xlm_roberta_xl(model: Transformer) -> HFLayout:
    cfg, state = model.cfg, model.state_dict()
    # RoBERTa numbers real tokens from pad_id + 1 (pad tokens get pad_id): our table, shifted
    offset = SPECIAL.pad + 1
    positions = torch.cat([torch.zeros(offset, cfg.d_model), state["positions.weight"]])
    tensors = _embeddings(model, positions)
    tensors["encoder.LayerNorm.weight"] = state["encoder.edge_norm.weight"]
    tensors["encoder.LayerNorm.bias"] = state["encoder.edge_norm.bias"]
    tensors |= _encoder_layers(model.encoder, pre_norm=True)
    config = _encoder_config(model, cfg.max_len + offset) | {"model_type": "xlm-roberta-xl"}
    config |= _tied_masked_lm("XLMRobertaXLForTiedMaskedLM", "XLMRobertaXLForPooledClassification")
    why = (
        "a pre-norm encoder with learned positions and no norm on the embeddings is XLM-RoBERTa-XL "
        "exactly (RoBERTa-PreLayerNorm normalises the embeddings, ours does not; XLMRobertaXLModel: "
        "hidden states; its masked-LM head has a transform ours lacks, so the masked-LM class is the "
        "remote XLMRobertaXLForTiedMaskedLM: the hidden states times the word embeddings)"
    )
    return HFLayout("XLMRobertaXLModel", config, tensors, why)


def _xlnet(model: Transformer) -> HFLayout:
    """XLNet's encoder (attn_type bi) in XLNetLMHeadModel's names: the projections as [d, heads, head]
    (ours [out, in]: transposed), u and v per layer (untie_r), no segment term; the LM head tied, with
    XLNet's output bias at zero; the query stream's mask embedding, which pretraining's head keeps, zero."""
    cfg, state = model.cfg, model.state_dict()
    d, heads, head = cfg.d_model, cfg.n_heads, cfg.head_dim
    tensors = {
        "transformer.word_embedding.weight": state["embed.weight"],
        "transformer.mask_emb": torch.zeros(1, 1, d),
        "lm_loss.weight": state["embed.weight"],
        "lm_loss.bias": torch.zeros(cfg.vocab_size),
    }
    for i in range(cfg.n_layers):
        ours, theirs = f"encoder.blocks.{i}", f"transformer.layer.{i}"
        q, kv = state[f"{ours}.self_attn.q.weight"], state[f"{ours}.self_attn.kv.weight"]
        projections = {"q": q, "k": kv[:d], "v": kv[d:], "r": state[f"{ours}.self_attn.r.weight"]}
        for name, weight in projections.items():
            tensors[f"{theirs}.rel_attn.{name}"] = weight.T.reshape(d, heads, head)
        tensors[f"{theirs}.rel_attn.o"] = state[f"{ours}.self_attn.out.weight"].reshape(d, heads, head)
        tensors[f"{theirs}.rel_attn.r_w_bias"] = state[f"{ours}.self_attn.content_bias"]
        tensors[f"{theirs}.rel_attn.r_r_bias"] = state[f"{ours}.self_attn.position_bias"]
        tensors[f"{theirs}.rel_attn.r_s_bias"] = torch.zeros(heads, head)
        tensors[f"{theirs}.rel_attn.seg_embed"] = torch.zeros(2, heads, head)
        for kind in ("weight", "bias"):
            tensors[f"{theirs}.rel_attn.layer_norm.{kind}"] = state[f"{ours}.norm1.{kind}"]
            tensors[f"{theirs}.ff.layer_norm.{kind}"] = state[f"{ours}.norm2.{kind}"]
            tensors[f"{theirs}.ff.layer_1.{kind}"] = state[f"{ours}.mlp.up.{kind}"]
            tensors[f"{theirs}.ff.layer_2.{kind}"] = state[f"{ours}.mlp.down.{kind}"]
    config = _common(model) | {
        "model_type": "xlnet",
        "d_model": d,
        "n_layer": cfg.n_layers,
        "n_head": heads,
        "d_inner": cfg.d_ff,
        "ff_activation": "gelu",
        "untie_r": True,
        "attn_type": "bi",
        "mem_len": cfg.mem_len or None,
        "dropout": cfg.dropout,
        "layer_norm_eps": cfg.norm_eps,
    }
    config |= _tied_masked_lm("XLNetForTiedMaskedLM")
    why = (
        "a post-norm encoder with Transformer-XL's relative attention, LayerNorm, GELU and biases in the "
        "MLP is XLNet (attn_type bi) exactly: XLNetLMHeadModel's logits are ours (its output bias zero), "
        "the masked-LM class is the remote XLNetForTiedMaskedLM (transformers maps no XLNet class to it)"
    )
    return HFLayout("XLNetLMHeadModel", config, tensors, why)


def _remote(model: Transformer, reason: str) -> HFLayout:
    lm = model.arch.lm_auto_class
    auto_map = {
        "AutoConfig": "modeling_lmpipe.LmpipeConfig",
        "AutoModel": "modeling_lmpipe.LmpipeModel",
        "AutoModelForSequenceClassification": "modeling_lmpipe.LmpipeForSequenceClassification",
    }
    if lm is not None:
        auto_map[lm] = "modeling_lmpipe.LmpipeForLM"
    config = _common(model) | {"model_type": "lmpipe", "lmpipe": model.cfg.to_dict(), "auto_map": auto_map}
    if lm == "AutoModelForMaskedLM":
        config["custom_pipelines"] = FILL_MASK
    tensors = {f"net.{key}": value for key, value in model.state_dict().items()}
    why = f"{reason}: remote code (trust_remote_code=True) runs our modules"
    return HFLayout("LmpipeForLM" if lm is not None else "LmpipeModel", config, tensors, why)


# the layout of each transformers class an architecture may name (`export_classes`); what each needs
# of a model is models/hf_classes.py's
NATIVE: dict[str, Callable[[Transformer], HFLayout]] = {
    "GPT2LMHeadModel": _gpt2,
    "BertModel": _bert,
    "BertForMaskedLM": _bert_for_masked_lm,
    "XLMRobertaXLModel": _xlm_roberta_xl,
    "XLNetLMHeadModel": _xlnet,
}


def hf_layout(model: Transformer) -> HFLayout:
    """The first of the architecture's transformers classes that computes what the model does, or our
    remote code, saying why each class does not."""
    name, mismatches = native_class(model)
    if name is not None:
        return NATIVE[name](model)
    return _remote(model, "; ".join(mismatches) or model.arch.remote_because)
