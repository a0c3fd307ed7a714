"""A LoRA fine-tune's adapter in peft's format, for the transformers export of the model it fine-tuned:

    base = AutoModelForSequenceClassification.from_pretrained(
        "checkpoints/<model>/hf", num_labels=<labels>, trust_remote_code=True)
    model = PeftModel.from_pretrained(base, "data/finetune/<model>/pretrained/<task>/seed<k>/adapter")

computes the fine-tune's predictions. Our LoRA weights are renamed to the export's modules
(models/hf_classes.py chooses its class): the remote code keeps our names under `net.`; BERT and
XLM-RoBERTa-XL keep q, k and v apart, so our fused projection's A goes to each and its B's rows are
split among them (the same update, B A = [B_q; B_k; B_v] A); GPT-2's fused Conv1D takes them whole.
The head (`score`) is peft's `modules_to_save`. XLNet's projections are tensors, not layers, which
peft cannot adapt: no adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from models.hf_classes import native_class
from models.transformer import Transformer

# our layer (its name in a block) -> its modules in each native class's layer
ENCODER_LAYERS = {
    "self_attn.qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "self_attn.out": ("attention.output.dense",),
    "mlp.up": ("intermediate.dense",),
    "mlp.down": ("output.dense",),
}
GPT2_LAYERS = {
    "self_attn.qkv": ("attn.c_attn",),
    "self_attn.out": ("attn.c_proj",),
    "mlp.up": ("mlp.c_fc",),
    "mlp.down": ("mlp.c_proj",),
}
# a native class -> (where its layers are, their modules); the base model under the classifier's name
LAYERS = {
    "BertModel": ("bert.encoder.layer", ENCODER_LAYERS),
    "BertForMaskedLM": ("bert.encoder.layer", ENCODER_LAYERS),
    "XLMRobertaXLModel": ("roberta.encoder.layer", ENCODER_LAYERS),
    "GPT2LMHeadModel": ("transformer.h", GPT2_LAYERS),
}


def lora_modules(model: Transformer) -> dict[str, tuple[Tensor, Tensor]]:
    """Our layers that peft adapted (their names in the model) and their (A, B)."""
    return {
        name: (module.lora_A["default"].weight, module.lora_B["default"].weight)
        for name, module in model.named_modules()
        if hasattr(module, "lora_A") and "default" in module.lora_A
    }


def export_names(layout: str | None, name: str) -> list[str]:
    """The export's modules of our layer `name` (`encoder.blocks.3.self_attn.qkv`): one, or the three
    that split a fused q, k, v (their B rows in that order)."""
    if layout is None:
        return [f"net.{name}"]
    where, layers = LAYERS[layout]
    _, _, index, *part = name.split(".")
    return [f"{where}.{index}.{module}" for module in layers[".".join(part)]]


def adapter_tensors(
    model: Transformer, head: nn.Linear, layout: str | None
) -> tuple[dict[str, Tensor], list[str]]:
    """peft's adapter_model.safetensors of the model's LoRA weights and the head, and the export's
    modules they adapt."""
    tensors, targets = {}, []
    for name, (a, b) in lora_modules(model).items():
        modules = export_names(layout, name)
        for module, rows in zip(modules, b.chunk(len(modules)), strict=True):
            tensors[f"base_model.model.{module}.lora_A.weight"] = a
            tensors[f"base_model.model.{module}.lora_B.weight"] = rows
            targets.append(module)
    tensors["base_model.model.score.weight"] = head.weight
    tensors["base_model.model.score.bias"] = head.bias
    return {key: value.detach().contiguous().clone().cpu() for key, value in tensors.items()}, targets


def lora_adapter_class(model: Transformer) -> tuple[str | None, str | None]:
    """(the export's native class or None for the remote code, why peft cannot load an adapter onto it
    or None): chosen from the model before LoRA is added to it."""
    layout, _ = native_class(model)
    if layout is not None and layout not in LAYERS:
        return layout, f"{layout}'s projections are tensors, not layers, which peft cannot adapt"
    return layout, None


def write_lora_adapter(
    out: Path,
    model: Transformer,
    head: nn.Linear,
    layout: str | None,
    options: dict[str, Any],
    pooling: str,
    base: str,
) -> None:
    """`out/adapter_config.json` and `out/adapter_model.safetensors`, and a README of how to load them."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors, targets = adapter_tensors(model, head, layout)
    config = LoraConfig(
        r=options["rank"],
        lora_alpha=options["alpha"],
        lora_dropout=options["dropout"],
        target_modules=sorted(targets),
        fan_in_fan_out=layout == "GPT2LMHeadModel",  # GPT-2's Conv1D keeps its weight as [in, out]
        modules_to_save=["score"],
        task_type="SEQ_CLS",
        base_model_name_or_path=base,
    )
    out.mkdir(parents=True)
    config.save_pretrained(str(out))
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    labels = len(head.bias)
    (out / "README.md").write_text(
        "# A LoRA fine-tune's adapter (peft)\n\n"
        "```python\n"
        "from peft import PeftModel\n"
        "from transformers import AutoModelForSequenceClassification\n\n"
        f'base = AutoModelForSequenceClassification.from_pretrained("{base}", num_labels={labels}, '
        f"pooling={json.dumps(pooling)}, trust_remote_code=True)\n"
        'model = PeftModel.from_pretrained(base, "<this folder>")\n'
        "```\n\n"
        f"`pooling` is the fine-tune's ({pooling}); the inputs are the tokenizer's "
        "`[CLS] a [SEP] b [SEP]`.\n",
        encoding="utf-8",
    )
