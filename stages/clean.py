"""Stage `clean`: normalise, filter by quality rules, drop exact and near duplicates.

`data/raw/<source>/*.parquet` (the sources of `ingest.sources`, in order) -> `data/clean/part-*.parquet`
(id, source, text, meta; in corpus order) and `metrics/clean.json`, where every dropped document is counted
against the first rule it breaks; none is dropped silently.

Memory stays flat in the corpus size: the work is done per shard (a row group of a raw file) in
parallel, on every core or on a Dask cluster (`cluster.scheduler`), and dedup runs as phases over files
(lmpipe/data/dedup.py). Each shard's judged documents (their rules, exact keys and LSH bands) and its
output are kept in `data/.kept/clean/` by digest, whole or not at all: a killed run resumes from its
finished shards, and a corpus that grows judges its new shards only, with the outputs of a run from
scratch (lmpipe/data/cleaning.py).
"""

from __future__ import annotations

import shutil

from lmpipe.data.cleaning import clean
from lmpipe.data.quality import DOCUMENT_RULES, RULES
from lmpipe.layout import CLEAN, CLEAN_METRICS, CLEAN_WORK, raw_dir
from lmpipe.params.clean import CleanParams
from lmpipe.params.cluster import ClusterParams
from lmpipe.params.ingest import IngestParams
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.runtime import (
    StageError,
    atomic_dir,
    cpu_threads,
    log,
    read_json,
    run_main,
    write_json,
)
from lmpipe.tracking import stage_run, tracking_experiment


class CleanSections(Sections):
    clean: CleanParams = CleanParams()
    ingest: IngestParams  # which sources' documents it reads
    cluster: ClusterParams = ClusterParams()


def main() -> None:
    params = load_stage_params(CleanSections)
    cfg = params.clean
    # the sources params name, not whatever data/raw holds (a removed source's folder stays there)
    sources = list(params.ingest.sources)
    manifests = [read_json(raw_dir(name) / "manifest.json", f"ingest@{name}") for name in sources]
    files = [path for name in sources for path in sorted(raw_dir(name).glob("*.parquet"))]
    synthetic = any(m["synthetic"] for m in manifests)
    workers = cpu_threads(cfg.workers)
    with stage_run(
        "clean",
        tracking_experiment(),
        {"seed": params.seed, "clean": cfg.model_dump()},
        {"data.synthetic": synthetic},
    ) as run:
        with atomic_dir(CLEAN) as tmp:
            counts = clean(files, cfg, params.seed, workers, params.cluster.scheduler, tmp)
            dropped = {rule.name: counts[f"dropped.{rule.name}"] for rule in RULES}
            if counts["documents_kept"] == 0:
                raise StageError(
                    f"clean: no documents left after cleaning ({counts['documents_in']} in); "
                    "dropped by rule: " + ", ".join(f"{rule}={n}" for rule, n in dropped.items() if n)
                )
            write_json(
                tmp / "manifest.json",
                {"synthetic": synthetic, "sources": sources, "documents": counts["documents_kept"]},
            )
        shutil.rmtree(CLEAN_WORK, ignore_errors=True)
        report = {
            "documents_in": counts["documents_in"],
            "documents_kept": counts["documents_kept"],
            "characters_in": counts["characters_in"],
            "characters_kept": counts["characters_kept"],
            "kept_fraction": round(counts["documents_kept"] / counts["documents_in"], 6),
            "dropped": dropped,
            # the raw characters of the documents each per-document rule dropped
            "dropped_characters": {
                rule.name: counts[f"dropped_characters.{rule.name}"] for rule in DOCUMENT_RULES
            },
        }
        write_json(CLEAN_METRICS, report)
        run.log_metrics(report)
        log.info(
            "clean: kept %d of %d documents; dropped %s",
            counts["documents_kept"],
            counts["documents_in"],
            {rule: n for rule, n in dropped.items() if n},
        )


if __name__ == "__main__":
    run_main(main)
