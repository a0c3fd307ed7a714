"""Stage `tokenizer`: SentencePiece (unigram or BPE) trained on the clean text.

Writes `data/tokenizer/spm.model`, `spm.vocab` and `tokenizer.json` with the fixed special-token ids:
`<pad>`=0 `<unk>`=1 `<s>`=2 `</s>`=3 `[CLS]`=4 `[SEP]`=5 `[MASK]`=6 and `<extra_id_0..99>`=7..106.
Specials are control symbols: literal "[MASK]" in the text never becomes the mask token.
"""

from __future__ import annotations

import hashlib

import sentencepiece as spm

from lmpipe.data.tokenizer import check_specials, train, training_lines
from lmpipe.layout import CLEAN, CLEAN_METRICS, SPM_MODEL, TOKENIZER, clean_shards
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.params.tokenizer import TokenizerParams
from lmpipe.runtime import (
    atomic_dir,
    log,
    read_json,
    run_main,
    write_json,
)
from lmpipe.tracking import stage_run, tracking_experiment
from models.special import SPECIAL_IDS


class TokenizerSections(Sections):
    tokenizer: TokenizerParams = TokenizerParams()


def main() -> None:
    params = load_stage_params(TokenizerSections)
    cfg = params.tokenizer
    manifest = read_json(CLEAN / "manifest.json", "clean")
    clean_metrics = read_json(CLEAN_METRICS, "clean")
    with stage_run(
        "tokenizer",
        tracking_experiment(),
        {"seed": params.seed, "tokenizer": cfg.model_dump()},
        {"data.synthetic": manifest["synthetic"]},
    ) as run:
        stats = {"documents": 0, "characters": 0}
        lines = training_lines(clean_shards(), cfg, clean_metrics["characters_kept"], params.seed, stats)
        model = train(lines, cfg, params.seed)
        processor = spm.SentencePieceProcessor(model_proto=model)
        check_specials(processor)
        digest = hashlib.sha256(model).hexdigest()
        with atomic_dir(TOKENIZER) as tmp:
            (tmp / SPM_MODEL.name).write_bytes(model)
            vocab = "".join(
                f"{processor.id_to_piece(i)}\t{processor.get_score(i):.4f}\n"
                for i in range(processor.get_piece_size())
            )
            (tmp / "spm.vocab").write_text(vocab, encoding="utf-8")
            write_json(
                tmp / "tokenizer.json",
                {
                    "model_type": cfg.model_type,
                    "vocab_size": processor.get_piece_size(),
                    "normalization": cfg.normalization,
                    "byte_fallback": cfg.byte_fallback,
                    "special_ids": SPECIAL_IDS,
                    "pad_id": 0,
                    "unk_id": 1,
                    "bos_id": 2,
                    "eos_id": 3,
                    "cls_id": SPECIAL_IDS["[CLS]"],
                    "sep_id": SPECIAL_IDS["[SEP]"],
                    "mask_id": SPECIAL_IDS["[MASK]"],
                    "sentinel_ids": [SPECIAL_IDS["<extra_id_0>"], SPECIAL_IDS["<extra_id_99>"]],
                    "sha256": digest,
                    "trained_on": stats,
                    "synthetic": manifest["synthetic"],
                },
            )
        run.log_metrics({"trained_on": stats, "vocab_size": processor.get_piece_size()})
        run.set_tags({"tokenizer_sha256": digest})
        log.info(
            "tokenizer: %s, %d pieces, trained on %d documents (%.1f MB), sha256 %s",
            cfg.model_type,
            processor.get_piece_size(),
            stats["documents"],
            stats["characters"] / 1e6,
            digest[:12],
        )


if __name__ == "__main__":
    run_main(main)
