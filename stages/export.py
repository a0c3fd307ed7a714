"""Stage `export@<model>`: the pretrained model and its tokenizer as a transformers folder.

Writes `checkpoints/<model>/hf/`: `config.json` and `model.safetensors` in the layout of the
transformers class that computes exactly what ours does (models/hf.py: GPT-2, BERT, XLM-RoBERTa-XL),
else our own modules as remote code (`modeling_lmpipe.py`, loaded with `trust_remote_code=True`);
`tokenizer.json`, the SentencePiece model (unigram or BPE) as a `tokenizers` model with the same
normalisation, ids and `[CLS] a [SEP] b [SEP]` template as fine-tuning; and a README saying which
class and why.
Writing needs no transformers; loading needs only it (a dependency of the project).
"""

from __future__ import annotations

import argparse

from lmpipe.layout import SPM_MODEL, WEIGHTS, final_checkpoint, hf_export
from lmpipe.params.models import ModelsSections
from lmpipe.params.project import load_stage_params
from lmpipe.runtime import StageError, atomic_dir, log, run_main, sha256_file
from lmpipe.tracking import stage_run, tracking_experiment
from models.export import ExportError, write_export


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.export")
    parser.add_argument("model", help="a key of params.yaml: models")
    name = parser.parse_args(argv).model
    params = load_stage_params(ModelsSections)
    params.check_model(name)

    from models.hf import hf_layout, without_lm_head
    from models.specs.objectives import OBJECTIVES
    from models.transformer import load_pretrained

    source = final_checkpoint(name)
    model, provenance = load_pretrained(source)
    layout = hf_layout(model)
    if not OBJECTIVES[provenance["objective"]].trains_lm_head:  # ELECTRA's discriminator
        layout = without_lm_head(layout, provenance["objective"])
    weights = sha256_file(source / WEIGHTS)
    tags = {"model": name, "arch": model.cfg.arch, "hf_class": layout.architecture}
    experiment = tracking_experiment()
    with (
        stage_run("export", experiment, {"model": name}, tags, f"export@{name}") as run,
        atomic_dir(hf_export(name)) as tmp,
    ):
        try:
            write_export(tmp, model, SPM_MODEL, {"name": name, "weights_sha256": weights}, layout)
        except ExportError as exc:
            raise StageError(str(exc)) from None
        run.log_artifact(str(tmp / "README.md"))
        run.log_artifact(str(tmp / "config.json"))
    log.info(
        "export@%s: %s (%s model) in %s", name, layout.architecture, provenance["objective"], hf_export(name)
    )


if __name__ == "__main__":
    run_main(main)
