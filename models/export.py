"""A pretrained model and its tokenizer as a transformers folder: the work of stage `export@<model>`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any


class ExportError(ValueError):
    """A model and tokenizer that cannot be exported together (the stage reports it as one line)."""


_CONTROL = 3  # SentencePiece's piece type of control symbols (our specials)


_BPE = 2  # SentencePiece's model type of BPE (1: unigram)


def bpe_merges(proto: Any) -> list[tuple[str, str]]:
    """SentencePiece BPE keeps no merge list: every split of a piece into two pieces is a merge, ranked
    as SentencePiece applies them, by the merged piece's score."""
    pieces = {piece.piece: (-piece.score, i) for i, piece in enumerate(proto.pieces)}
    merges = [
        (rank, text[:k], text[k:])
        for text, rank in pieces.items()
        for k in range(1, len(text))
        if text[:k] in pieces and text[k:] in pieces
    ]
    return [(left, right) for _, left, right in sorted(merges)]


def hf_tokenizer(spm_model: Path, max_len: int):
    """The SentencePiece model as a `tokenizers.Tokenizer` that gives the same ids: its precompiled
    normalisation, whitespace folding and dummy prefix, the Unigram scores or BPE merges, byte
    fallback."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE, Unigram

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(spm_model.read_bytes())
    fallback = proto.trainer_spec.byte_fallback
    if proto.trainer_spec.model_type == _BPE:
        ids = {piece.piece: i for i, piece in enumerate(proto.pieces)}
        tokenizer = Tokenizer(
            BPE(ids, bpe_merges(proto), unk_token="<unk>", fuse_unk=True, byte_fallback=fallback)
        )
    else:
        vocab = [(piece.piece, piece.score) for piece in proto.pieces]
        tokenizer = Tokenizer(Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=fallback))
    charsmap = proto.normalizer_spec.precompiled_charsmap
    steps = [normalizers.Precompiled(charsmap)] if charsmap else []
    # SentencePiece's remove_extra_whitespaces: no leading or trailing space, runs of spaces as one
    tokenizer.normalizer = normalizers.Sequence(
        [*steps, normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = [piece.piece for piece in proto.pieces if piece.type == _CONTROL]
    tokenizer.add_special_tokens([AddedToken(piece, special=True, normalized=False) for piece in specials])
    ids = {piece: tokenizer.token_to_id(piece) for piece in ("[CLS]", "[SEP]")}
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=list(ids.items())
    )
    tokenizer.enable_truncation(max_len)
    return tokenizer


def tokenizer_config(max_len: int, sentinels: list[str]) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "padding_side": "right",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "additional_special_tokens": sentinels,  # <extra_id_0..99>: T5's span-corruption sentinels
    }


def remote_code() -> str:
    """The model's code (models/hf.py: `remote_modules`) as one self-contained modeling file."""
    from models.hf import remote_modules

    parts = ['"""lmpipe\'s Transformer for transformers (trust_remote_code=True), by stages/export.py."""\n']
    parts.append("from __future__ import annotations\n")
    for module in remote_modules():
        lines = Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8").splitlines()
        kept = [line for line in lines if not line.startswith(("from models.", "from __future__"))]
        parts.append(f"\n# ---- {module} ----\n" + "\n".join(kept) + "\n")
    return "".join(parts)


def readme(name: str, architecture: str, why: str, config: dict, weights_sha256: str) -> str:
    remote = architecture.startswith("Lmpipe")
    load = "AutoModel.from_pretrained(path" + (", trust_remote_code=True)" if remote else ")")
    fill_mask = ""
    if "custom_pipelines" in config:
        masked_lm = config["auto_map"]["AutoModelForMaskedLM"].split(".")[-1]
        fill_mask = f"""- Fill a mask: `pipeline("fill-mask", model=path, trust_remote_code=True)` runs
  `{masked_lm}` (modeling_lmpipe.py), the head this model was trained with; without
  `trust_remote_code` the pipeline refuses, and `AutoModelForMaskedLM` without it would build the
  native class's head, which was never trained.
"""
    return f"""# {name}: a pretrained lmpipe model for transformers

- Class: `{architecture}`. Why: {why}.
- Load: `{load}` and `AutoTokenizer.from_pretrained(path)`; `AutoModelForSequenceClassification`
  gives a fine-tunable classifier ({"our pooling and a linear head" if remote else "the class's own head"}).
{fill_mask}- Tokenizer: the project's SentencePiece model as a `tokenizers` Unigram: the same ids for any
  text, and `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]` as our fine-tuning encodes (no segment embeddings).
  One difference: a literal special-token string in raw text (`[MASK]`) becomes that token here, as in
  every transformers tokenizer, while SentencePiece spells it out.
- Weights: exported from `checkpoints/{name}/final` (sha256 of model.safetensors `{weights_sha256}`);
  the logits or hidden states equal ours to 1e-5 (tests/test_export.py).
"""


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_export(
    out: Path, model: Any, spm_model: Path, provenance: dict[str, str], layout: Any = None
) -> Any:
    """The transformers folder of `model` (ours, any configuration; `layout` if already mapped) and
    the tokenizer into `out`."""
    from safetensors.torch import save_file

    from models.hf import hf_layout

    layout = layout or hf_layout(model)
    tokenizer = hf_tokenizer(spm_model, model.cfg.max_len)
    if tokenizer.get_vocab_size() != model.cfg.vocab_size:
        raise ExportError(
            f"export@{provenance['name']}: the tokenizer has {tokenizer.get_vocab_size()} ids, the model "
            f"{model.cfg.vocab_size}: re-run `dvc repro` so that both come from the same run"
        )
    sentinels = sorted(
        (t for t in tokenizer.get_vocab() if t.startswith("<extra_id_")), key=lambda t: int(t[10:-1])
    )
    tensors = {key: value.detach().contiguous().clone() for key, value in layout.tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", {"architectures": [layout.architecture], **layout.config})
    if "auto_map" in layout.config:  # remote code: the whole model's, or a native encoder's masked LM
        (out / "modeling_lmpipe.py").write_text(remote_code(), encoding="utf-8")
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(model.cfg.max_len, sentinels))
    text = readme(
        provenance["name"], layout.architecture, layout.why, layout.config, provenance["weights_sha256"]
    )
    (out / "README.md").write_text(text, encoding="utf-8")
    return layout
