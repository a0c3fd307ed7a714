"""Stage `ingest@<name>`: the source `ingest.sources.<name>` -> `data/raw/<name>/part-*.parquet`
(id, source, text, meta) and `metrics/ingest/<name>.json`.

A source is a local file or folder (`path`, which dvc.yaml declares as the stage's dependency, so DVC
hashes it and any added, removed or edited file makes the stage stale): text files (txt, jsonl, json,
parquet, csv, each optionally .gz; WikiExtractor's files an article a document, its title and url as
`meta`; Project Gutenberg books with their header and footer marked) picked by `include`, a local
Hugging Face builder (streamed, capped at `max_documents`), a `save_to_disk` folder (Hub datasets
arrive as one, from the `hub` stage), or the unlabeled text of GLUE tasks' train splits as
glue_prepare wrote them (task-adaptive pretraining, Gururangan et al. 2020).

A folder of files is read in units of up to UNIT_BYTES (whole files, in order), each into parts of
its own: on every core here or on a Dask cluster (`cluster.scheduler`). Each file's documents and
each unit's parts are kept by digest (`data/.kept/ingest/<name>`): an interrupted run resumes from
what it finished, and a new, changed or removed file is the only one read again. The parts are the
stage's output in the units' order, so the documents and their ids are the same whatever runs them.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence

from lmpipe.layout import ingest_metrics, raw_dir
from lmpipe.params.cluster import ClusterParams
from lmpipe.params.ingest import IngestParams
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.runtime import (
    StageError,
    atomic_dir,
    log,
    run_main,
    write_json,
)
from lmpipe.tracking import stage_run, tracking_experiment


class IngestSections(Sections):
    ingest: IngestParams
    cluster: ClusterParams = ClusterParams()


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    params = load_stage_params(IngestSections)
    cfg = params.ingest
    if len(args) != 1 or args[0] not in cfg.sources:
        known = ", ".join(cfg.sources)
        raise StageError(f"usage: python -m stages.ingest <source>; the sources (ingest.sources): {known}")
    name = args[0]
    source, key = cfg.sources[name], f"ingest.sources.{name}"
    with stage_run(
        "ingest",
        tracking_experiment(),
        {"ingest": {"source": name, **source.model_dump(), "encoding_errors": cfg.encoding_errors}},
        {"source": name},
    ) as run:
        # the readers (pandas, pyarrow: 0.6 s) load once the run's writer has started: ingest is often a
        # pipeline's first stage, which waits for a writer that was not running (lmpipe/run_writer.py)
        from lmpipe.data.ingesting import glue_manifest, ingest

        synthetic = source.synthetic or (source.kind == "glue" and glue_manifest(source, key)["synthetic"])
        run.set_tags({"data.synthetic": synthetic})
        counts: Counter = Counter()
        with atomic_dir(raw_dir(name)) as tmp:
            shards = ingest(name, params.ingest, params.cluster.scheduler, tmp, counts)
            if counts["documents"] == 0:
                raise StageError(f"{key}: no documents in '{source.path}': {dict(sorted(counts.items()))}")
            write_json(
                tmp / "manifest.json",
                {
                    "name": name,
                    "kind": source.kind,
                    "synthetic": synthetic,
                    "documents": counts["documents"],
                    "characters": counts["characters"],
                    "shards": shards,
                },
            )
        report = dict(sorted(counts.items()))
        write_json(ingest_metrics(name), report)
        run.log_metrics(report)
        log.info(
            "ingest %s: %d documents, %.1f MB in %d shard(s)",
            name,
            counts["documents"],
            counts["characters"] / 1e6,
            shards,
        )


if __name__ == "__main__":
    run_main(main)
