"""Which transformers class computes exactly what a model does: what each class an architecture may
name (`export_classes`) needs of its configuration. models/hf.py maps the weights into the class it
chooses; models/peft_export.py names a LoRA adapter's modules in it. Apart from models/hf.py, whose
remote-code sources make every importer's code the whole model code."""

from __future__ import annotations

from typing import Any

# beyond the standard configuration (`differences`): a norm position, a head and positions. GPT-2 has
# no transform; BERT's and XLM-R XL's masked-LM heads have one, so a tied encoder's masked LM is our
# remote class
REQUIRES: dict[str, tuple[str, str, str]] = {
    "GPT2LMHeadModel": ("pre", "tied", "learned"),
    "BertModel": ("post", "tied", "learned"),
    "BertForMaskedLM": ("post", "transform", "learned"),
    "XLMRobertaXLModel": ("pre", "tied", "learned"),
    "XLNetLMHeadModel": ("post", "tied", "xl"),
}


def differences(model: Any) -> list[str]:
    """How the model differs from what GPT-2, BERT, XLM-R XL and XLNet compute beyond their positions
    (REQUIRES): LayerNorm with bias, GELU, biases, no segment embeddings (theirs come from
    token_type_ids), and none of ALBERT's factorised embeddings or shared layers (its transformers class
    has a head ours lacks)."""
    cfg = model.cfg
    differs = {
        "norm": cfg.norm != "layernorm",
        "mlp": cfg.mlp != "gelu",
        "bias": not cfg.bias,
        "segment_embeddings": cfg.segment_embeddings,
        "embedding_size": cfg.embedding_size is not None,
        "share_layers": cfg.share_layers != "none",
    }
    return [f"{key}={getattr(cfg, key)}" for key, different in differs.items() if different]


def native_class(model: Any) -> tuple[str | None, list[str]]:
    """The first of the architecture's transformers classes that computes what the model (ours, a
    Transformer) does (None: none does, the export is remote code), and why each one before it does
    not."""
    cfg, mismatches = model.cfg, []
    for name in model.arch.export_classes:
        norm_position, lm_head, positions = REQUIRES[name]
        found = differences(model)
        if cfg.positions != positions:
            found.append(f"positions={cfg.positions}")
        if (cfg.norm_position, cfg.lm_head) != (norm_position, lm_head):
            found.append(f"norm_position={cfg.norm_position} with lm_head={cfg.lm_head}")
        if not found:
            return name, mismatches
        mismatches.append(f"{name} has no {', '.join(found)}")
    return None, mismatches
