"""Stage `sample`: the deterministic synthetic data of the offline default profile.

Writes `data/sample/corpus/part-*.txt` (documents separated by blank lines), small GLUE-like tasks in
the original GLUE TSV layout under `data/sample/glue/<Task>/{train,dev}.tsv`, and a manifest that
marks everything as synthetic.
"""

from __future__ import annotations

from lmpipe.data.synthetic import corpus, glue_files
from lmpipe.layout import SAMPLE
from lmpipe.params.project import load_stage_params
from lmpipe.params.sample import SampleParams
from lmpipe.params.schema import Sections
from lmpipe.runtime import atomic_dir, log, run_main, write_json
from lmpipe.tracking import stage_run, tracking_experiment


class SampleSections(Sections):
    sample: SampleParams = SampleParams()


def main() -> None:
    params = load_stage_params(SampleSections)
    cfg = params.sample
    with stage_run(
        "sample",
        tracking_experiment(),
        {"seed": params.seed, "sample": cfg.model_dump()},
        {"data.synthetic": True},
    ) as run:
        docs = corpus(params.seed, cfg.documents, cfg.lexicon_size, cfg.min_sentences, cfg.max_sentences)
        with atomic_dir(SAMPLE) as tmp:
            (tmp / "corpus").mkdir()
            for part in range(cfg.files):
                text = "\n\n".join(docs[part :: cfg.files]) + "\n"
                (tmp / "corpus" / f"part-{part:03d}.txt").write_text(text, encoding="utf-8")
            for folder, files in glue_files(
                params.seed, cfg.lexicon_size, cfg.glue_train_rows, cfg.glue_dev_rows
            ).items():
                (tmp / "glue" / folder).mkdir(parents=True)
                for name, text in files.items():
                    (tmp / "glue" / folder / name).write_text(text, encoding="utf-8")
            chars = sum(map(len, docs))
            write_json(
                tmp / "manifest.json",
                {
                    "synthetic": True,
                    "generator": "lmpipe.data.synthetic",
                    "seed": params.seed,
                    "documents": len(docs),
                    "characters": chars,
                },
            )
        run.log_metrics({"documents": len(docs), "characters": chars})
        log.info("sample: %d synthetic documents, %.0f KB in %s", len(docs), chars / 1e3, SAMPLE / "corpus")


if __name__ == "__main__":
    run_main(main)
