"""A LoRA fine-tune's adapter, loaded by peft onto the transformers export of its model: the same
logits as ours, for every export class peft can adapt (native BERT, XLM-RoBERTa-XL and GPT-2, and the
remote code), with padding and each pooling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.config import ModelConfig
from models.export import write_export
from models.finetune_methods import apply_method
from models.heads import SequenceHead
from models.peft_export import lora_adapter_class, write_lora_adapter
from models.transformer import Transformer

pytest.importorskip("peft", reason="peft, a dependency: pip install -e .")

SIZE = dict(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64)
LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.1, "targets": ["attention", "attention_out", "mlp"]}
CASES = [
    ("encoder", {}, "cls", "XLMRobertaXLModel"),
    ("encoder", {"norm_position": "post"}, "mean", "BertModel"),
    ("encoder", {"norm_position": "post", "lm_head": "transform"}, "max", "BertForMaskedLM"),
    ("decoder", {}, "last", "GPT2LMHeadModel"),
    ("encoder", {"positions": "rope", "norm": "rmsnorm"}, "mean", None),  # the remote code
    ("encoder_decoder", {}, "mean_encoder", None),
]


@pytest.mark.parametrize(("arch", "variant", "pooling", "layout"), CASES, ids=lambda v: str(v))
def test_peft_loads_the_adapter_onto_the_export_and_computes_our_logits(
    sample_build: Path, tmp_path: Path, arch: str, variant: dict, pooling: str, layout: str | None
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    spm_model = sample_build / "data/tokenizer/spm.model"
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, vocab_size=1024, **SIZE, **variant)).eval()
    (tmp_path / "hf").mkdir()
    write_export(tmp_path / "hf", model, spm_model, {"name": "test", "weights_sha256": "-"})
    assert lora_adapter_class(model) == (layout, None)
    head = SequenceHead(model, 3, pooling=pooling, frozen=True)
    apply_method(model, "lora", LORA, 0)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, parameter in head.named_parameters():
            if "lora_B" in name or name.startswith("out."):
                parameter.normal_(std=0.2)
    write_lora_adapter(tmp_path / "adapter", model, head.out, layout, LORA, pooling, str(tmp_path / "hf"))
    base = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "hf", num_labels=3, pooling=pooling, trust_remote_code=True
    )
    theirs = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ids = torch.randint(107, 1024, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 8:] = False
    with torch.no_grad():
        want = head.eval()(ids, mask)
        got = theirs(input_ids=ids, attention_mask=mask.long()).logits
        plain = base(input_ids=ids, attention_mask=mask.long()).logits  # the adapter is what differs
        with theirs.disable_adapter():
            without = theirs(input_ids=ids, attention_mask=mask.long()).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (got - without).abs().max() > 1e-2 and plain.shape == got.shape


def test_xlnet_exports_no_adapter_and_says_why() -> None:
    model = Transformer(
        ModelConfig(arch="encoder", vocab_size=1024, positions="xl", norm_position="post", **SIZE)
    )
    layout, why = lora_adapter_class(model)
    assert layout == "XLNetLMHeadModel" and why == (
        "XLNetLMHeadModel's projections are tensors, not layers, which peft cannot adapt"
    )
