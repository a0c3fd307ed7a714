"""export@<model>: transformers loads every architecture and variant with `from_pretrained` and computes
what ours does on real text; the exported tokenizer gives our ids; an exported encoder fine-tunes with
transformers' own Trainer. Needs the `hf` extra (transformers), which `make test` installs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

from models.config import PRESETS, ModelConfig
from models.export import write_export
from models.finetune_data import encode_pair
from models.transformer import Transformer
from tests.pipeline_helpers import run_stages
from tests.workdir import Workdir

transformers = pytest.importorskip("transformers", reason="transformers, a dependency: pip install -e .")

SIZE = dict(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=128)
# the presets' variants at a test size: bert-base is a post-norm encoder, gpt1 a post-norm decoder,
# t5-base a rotary, RMSNorm, bias-free encoder-decoder
T5 = {key: PRESETS["t5-base"][key] for key in ("norm", "bias", "positions")}
VARIANTS = [
    ("encoder", {}, "XLMRobertaXLModel"),
    ("encoder", {"norm_position": "post"}, "BertModel"),
    ("encoder", {"norm_position": "post", "lm_head": "transform"}, "BertForMaskedLM"),  # BERT's own head
    ("encoder", {"lm_head": "transform"}, "LmpipeForLM"),
    ("encoder", {"positions": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}, "LmpipeForLM"),
    ("encoder", {"positions": "sinusoidal"}, "LmpipeForLM"),
    ("encoder", {"positions": "relative"}, "LmpipeForLM"),
    ("encoder", {"norm_position": "post", "segment_embeddings": True}, "LmpipeForLM"),  # BERT's, with A/B
    # ALBERT's: factorized embeddings, every layer one block; E-wide sinusoids; attention shared by two
    ("encoder", {"norm_position": "post", "embedding_size": 32, "share_layers": "all"}, "LmpipeForLM"),
    ("encoder", {"embedding_size": 32, "share_layers": "all", "lm_head": "transform"}, "LmpipeForLM"),
    ("encoder", {"embedding_size": 16, "positions": "sinusoidal"}, "LmpipeForLM"),
    ("decoder", {}, "GPT2LMHeadModel"),
    ("decoder", {"norm_position": "post"}, "LmpipeForLM"),
    ("decoder", {"positions": "rope", "mlp": "swiglu"}, "LmpipeForLM"),
    ("decoder", {"positions": "alibi"}, "LmpipeForLM"),
    # Transformer-XL's relative positions (transformers' XLNet computes them causally, attn_type uni,
    # but fails on padded inputs: transformers#21626), with a memory
    ("decoder", {"positions": "xl", "norm_position": "post"}, "LmpipeForLM"),
    ("decoder", {"positions": "xl", "mem_len": 32}, "LmpipeForLM"),
    ("encoder", {"positions": "xl"}, "LmpipeForLM"),
    ("encoder", {"positions": "xl", "norm_position": "post"}, "XLNetLMHeadModel"),  # XLNet's, attn_type bi
    ("encoder", {"positions": "xl", "norm_position": "post", "mem_len": 32}, "XLNetLMHeadModel"),
    ("encoder_decoder", {}, "LmpipeForLM"),
    ("encoder_decoder", {**T5, "n_decoder_layers": 3}, "LmpipeForLM"),
    ("encoder_decoder", {"share_encoder_decoder": True}, "LmpipeForLM"),
    ("encoder_decoder", {"share_layers": "attention", "n_decoder_layers": 3}, "LmpipeForLM"),
    ("encoder_decoder", {"positions": "relative", "norm": "rmsnorm", "bias": False}, "LmpipeForLM"),
    ("prefix_lm", {}, "LmpipeForLM"),  # the input as the prefix, as fine-tuning reads it
]


def test_the_declarations_name_the_native_classes_and_the_variants_reach_each() -> None:
    """models/hf.py maps exactly the classes the declarations name (`export_classes`), and the
    variants above export through every one of them."""
    from models.hf import NATIVE
    from models.specs.architectures import ARCHITECTURES

    named = [name for spec in ARCHITECTURES.values() for name in spec.export_classes]
    assert sorted(named) == sorted(NATIVE)
    assert set(NATIVE) <= {hf_class for _, _, hf_class in VARIANTS}
    assert all(spec.export_classes or spec.remote_because for spec in ARCHITECTURES.values())


@pytest.fixture(scope="module")
def real_text(real_build: Path) -> tuple[Path, list[str]]:
    """The tokenizer trained on the real corpus and lines of that corpus (sentences of every length)."""
    import pyarrow.parquet as pq

    from lmpipe.layout import clean_shards

    texts = pq.read_table(clean_shards(real_build / "data/clean")[0], columns=["text"])
    lines = [line.strip() for doc in texts.column("text").to_pylist()[:40] for line in doc.split("\n")]
    return real_build / "data/tokenizer/spm.model", [line for line in lines if line][:400]


def exported(tmp_path: Path, arch: str, variant: dict, spm_model: Path) -> tuple[Transformer, str]:
    vocab = spm.SentencePieceProcessor(model_file=str(spm_model)).get_piece_size()
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch=arch, vocab_size=vocab, **SIZE, **variant)).eval()
    layout = write_export(tmp_path, model, spm_model, {"name": "test", "weights_sha256": "-"})
    return model, layout.architecture


@pytest.mark.parametrize(("arch", "variant", "hf_class"), VARIANTS, ids=lambda v: str(v))
def test_transformers_computes_what_ours_does_on_real_text(
    tmp_path: Path, real_text: tuple[Path, list[str]], arch: str, variant: dict, hf_class: str
) -> None:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    spm_model, lines = real_text
    model, architecture = exported(tmp_path, arch, variant, spm_model)
    assert architecture == hf_class
    remote = hf_class.startswith("Lmpipe")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=remote)
    batch = tokenizer(lines[:8], padding=True, truncation=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    assert not mask.all()  # padded: the comparison covers attention masks too
    with torch.no_grad():
        if arch == "encoder":
            theirs = AutoModel.from_pretrained(tmp_path, trust_remote_code=remote)
            got = theirs(input_ids=ids, attention_mask=batch["attention_mask"]).last_hidden_state
            want = model.encode(ids, mask)
        elif arch in ("decoder", "prefix_lm"):
            theirs = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=remote)
            got = theirs(input_ids=ids, attention_mask=batch["attention_mask"]).logits
            prefix = mask.long().sum(1) if arch == "prefix_lm" else None
            want = model.lm_logits(model.decode(ids, mask, prefix_lengths=prefix))
        else:
            theirs = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, trust_remote_code=True)
            targets = ids[:, 1:9]  # a decoder input of real tokens
            got = theirs(
                input_ids=ids, attention_mask=batch["attention_mask"], decoder_input_ids=targets
            ).logits
            want = model.lm_logits(model(ids, mask, targets))
            mask = torch.ones(targets.shape, dtype=torch.bool)
    # AutoModel: the backbone of an encoder's masked-LM class (LmpipeModel, BertModel)
    assert type(theirs).__name__ == hf_class or (
        arch == "encoder" and (remote or hf_class in ("BertForMaskedLM", "XLNetLMHeadModel"))
    )
    assert not theirs.training
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
    assert want[mask].abs().max() > 0.1  # real numbers compared, not zeros


@pytest.mark.parametrize(
    ("variant", "hf_class"), [(v, c) for arch, v, c in VARIANTS if arch == "encoder"], ids=lambda v: str(v)
)
def test_every_encoder_export_fills_a_mask_with_the_head_it_was_trained_with(
    tmp_path: Path, real_text: tuple[Path, list[str]], variant: dict, hf_class: str
) -> None:
    """AutoModelForMaskedLM's logits are ours (the head pretraining trained: the hidden states times
    the word embeddings, or BERT's transform and bias first), and `pipeline("fill-mask")` ranks and
    scores the tokens as our logits do; where the head is ours alone, without trust_remote_code the
    pipeline refuses rather than build an untrained head."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    spm_model, lines = real_text
    model, architecture = exported(tmp_path, "encoder", variant, spm_model)
    assert architecture == hf_class
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=True)
    masked = [" ".join(words[:3] + ["[MASK]"] + words[4:]) for words in (line.split() for line in lines[:8])]
    batch = tokenizer(masked, padding=True, truncation=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    assert not mask.all() and (ids == tokenizer.mask_token_id).sum() == len(masked)
    theirs = AutoModelForMaskedLM.from_pretrained(tmp_path, trust_remote_code=True)
    with torch.no_grad():
        got = theirs(input_ids=ids, attention_mask=batch["attention_mask"]).logits
        want = model.lm_logits(model.encode(ids, mask))
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
    assert want[mask].abs().max() > 0.1

    fill = pipeline("fill-mask", model=str(tmp_path), trust_remote_code=True, device="cpu")
    answers = fill(masked[0], top_k=5)
    at = int((ids[0] == tokenizer.mask_token_id).nonzero())
    probabilities = want[0, at].softmax(-1)
    best = probabilities.topk(5)
    assert [a["token"] for a in answers] == best.indices.tolist()
    assert [a["score"] for a in answers] == pytest.approx(best.values.tolist(), abs=1e-6)
    if hf_class == "BertForMaskedLM":  # transformers' own head: its own pipeline, the same answers
        native = pipeline("fill-mask", model=str(tmp_path), device="cpu")(masked[0], top_k=5)
        assert [a["token"] for a in native] == best.indices.tolist()
        return
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("fill-mask", model=str(tmp_path), device="cpu")


@pytest.fixture(scope="module")
def bpe_model(real_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece BPE model (tokenizer.model_type: bpe, case-folding normalisation), trained by
    the tokenizer stage's own function on the real corpus."""
    import pyarrow.parquet as pq

    from lmpipe.data.tokenizer import train
    from lmpipe.layout import clean_shards
    from lmpipe.params.tokenizer import TokenizerParams

    texts = pq.read_table(clean_shards(real_build / "data/clean")[0], columns=["text"])
    lines = (
        line for doc in texts.column("text").to_pylist()[:300] for line in doc.split("\n") if line.strip()
    )
    cfg = TokenizerParams(model_type="bpe", vocab_size=3000, normalization="nmt_nfkc_cf", threads=1)
    path = tmp_path_factory.mktemp("bpe") / "spm.model"
    path.write_bytes(train(lines, cfg, seed=1))
    return path


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_exported_tokenizer_gives_our_ids(
    tmp_path: Path, real_text: tuple[Path, list[str]], bpe_model: Path, kind: str
) -> None:
    from transformers import AutoTokenizer

    spm_model, lines = real_text
    spm_model = bpe_model if kind == "bpe" else spm_model
    exported(tmp_path, "decoder", {}, spm_model)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ours = spm.SentencePieceProcessor(model_file=str(spm_model))
    lines = [*lines, "  spaces   inside,\ttabs and  ﬁ ligatures, ½ and émigré — ✓ 😀 中文  "]
    assert [tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines] == ours.encode(lines)
    # fine-tuning's format: [CLS] a [SEP] and [CLS] a [SEP] b [SEP]
    pairs = list(zip(lines[0:40:2], lines[1:40:2], strict=True))
    for first, second in pairs:
        want = encode_pair(ours.encode(first), ours.encode(second), 10_000)
        assert tokenizer(first, second)["input_ids"] == want
    assert tokenizer(lines[0])["input_ids"] == encode_pair(ours.encode(lines[0]), None, 10_000)
    assert tokenizer.decode(tokenizer(lines[0], add_special_tokens=False)["input_ids"]) == ours.decode(
        ours.encode(lines[0])
    )
    assert (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.mask_token_id) == (0, 4, 6)


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_exported_encoder_fine_tunes_with_transformers_trainer(
    sample_pipeline: Workdir, tmp_path: Path
) -> None:
    """The export stage in a real run, then transformers' Trainer on the synthetic SST-2, as run_glue.py
    does it: AutoTokenizer, AutoModelForSequenceClassification, Trainer, dev accuracy."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    encoder = {"encoder_mlm": {"arch": "encoder", "objective": "mlm", "preset": "tiny"}}
    with sample_pipeline.changed({"models": encoder}):
        run_stages(sample_pipeline, "pretrain", "encoder_mlm")
        result = sample_pipeline.run("export", "encoder_mlm")
    assert result.returncode == 0, result.stderr[-2000:]
    folder = sample_pipeline.path / "checkpoints/encoder_mlm/hf"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["XLMRobertaXLModel"]
    assert "XLM-RoBERTa-XL" in (folder / "README.md").read_text()

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)

    def rows(split: str) -> list[dict]:
        path = sample_pipeline.path / f"data/sample/glue/SST-2/{split}.tsv"
        with path.open() as handle:
            table = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        encoded = tokenizer([r["sentence"] for r in table], truncation=True, max_length=64)
        return [
            {"input_ids": i, "label": int(r["label"])}
            for i, r in zip(encoded["input_ids"], table, strict=True)
        ]

    train, dev = rows("train"), rows("dev")
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        learning_rate=5e-4,
        num_train_epochs=4,
        per_device_train_batch_size=32,
        warmup_steps=0.1,  # a ratio of the training steps
        seed=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer)
    )
    trainer.train()
    logits = trainer.predict(dev).predictions
    accuracy = float((np.argmax(logits, -1) == [r["label"] for r in dev]).mean())
    majority = max(np.mean([r["label"] for r in dev]), 1 - np.mean([r["label"] for r in dev]))
    assert accuracy > 0.85 > majority + 0.2, (accuracy, majority)


@pytest.mark.parametrize("variant", [{}, {"positions": "rope"}], ids=["native", "remote"])
def test_an_electra_discriminator_exports_its_backbone_without_an_lm_class(
    tmp_path: Path, real_text: tuple[Path, list[str]], variant: dict
) -> None:
    """ELECTRA never trains the discriminator's tied LM head: the export offers no LM class and no
    fill-mask pipeline, says why, and its hidden states are ours."""
    from transformers import AutoModel, AutoTokenizer

    from models.hf import hf_layout, without_lm_head

    spm_model, lines = real_text
    vocab = spm.SentencePieceProcessor(model_file=str(spm_model)).get_piece_size()
    torch.manual_seed(0)
    model = Transformer(ModelConfig(arch="encoder", vocab_size=vocab, **SIZE, **variant)).eval()
    layout = without_lm_head(hf_layout(model), "electra")
    write_export(tmp_path, model, spm_model, {"name": "test", "weights_sha256": "-"}, layout)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "custom_pipelines" not in config
    assert "AutoModelForMaskedLM" not in config.get("auto_map", {})
    # the sequence classifier with our fine-tuning's head: remote code on the native backbone too
    assert config["auto_map"]["AutoModelForSequenceClassification"].startswith("modeling_lmpipe.")
    assert (tmp_path / "modeling_lmpipe.py").exists()
    assert "LM head was never trained (objective electra)" in (tmp_path / "README.md").read_text()
    remote = bool(variant)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=remote)
    batch = tokenizer(lines[:8], padding=True, truncation=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    theirs = AutoModel.from_pretrained(tmp_path, trust_remote_code=remote)
    with torch.no_grad():
        got = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        want = model.encode(batch["input_ids"], mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)
