"""Stage `pack`: encode the clean documents into flat token arrays for pretraining.

`data/tokens/{train,val}.bin` hold every document's ids followed by EOS, back to back (uint16 when the
vocabulary fits, else uint32; read them with `np.memmap(path, dtype=meta["dtype"])`), and `meta.json`
records vocab size, dtype, token and document counts and the tokenizer's hash. Documents go to train
or val by a seeded draw from the document's id alone, so a document added later never moves another.
`pack.repeat` upsamples an ingest source in the training tokens (a source's copies; its validation
documents stay once), and `meta.json` gives each source's training documents and tokens, counted
once, so its share of the mix can be read off.

Each clean shard is encoded on its own into `data/.kept/pack/` (whole or not at all, keyed by its
documents' bytes, their split and the tokenizer), in this process on every core, on a process per core
for a large corpus, or on a Dask cluster (`cluster.scheduler`); the shards' tokens are then
concatenated in order, so the outputs are the same bytes however the work ran. The entries stay: a
killed run resumes from the finished shards, and a corpus that grows encodes its new shards only.
"""

from __future__ import annotations

from lmpipe.data.packing import pack, token_dtype
from lmpipe.layout import CLEAN, SPM_MODEL, TOKENIZER, TOKENS, clean_shards
from lmpipe.params.cluster import ClusterParams
from lmpipe.params.pack import PackParams
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.runtime import (
    atomic_dir,
    log,
    read_json,
    run_main,
    write_json,
)
from lmpipe.tracking import stage_run, tracking_experiment


class PackSections(Sections):
    pack: PackParams = PackParams()
    cluster: ClusterParams = ClusterParams()


def main() -> None:
    params = load_stage_params(PackSections)
    cfg = params.pack
    manifest = read_json(CLEAN / "manifest.json", "clean")
    tok_meta = read_json(TOKENIZER / "tokenizer.json", "tokenizer")
    with stage_run(
        "pack",
        tracking_experiment(),
        {"seed": params.seed, "pack": cfg.model_dump()},
        {"data.synthetic": manifest["synthetic"], "tokenizer_sha256": tok_meta["sha256"]},
    ) as run:
        with atomic_dir(TOKENS) as tmp:
            counts = pack(clean_shards(), SPM_MODEL, cfg, params.seed, params.cluster.scheduler, tmp)
            meta = {
                "vocab_size": tok_meta["vocab_size"],
                "dtype": token_dtype(tok_meta["vocab_size"]).name,
                "eos_id": tok_meta["eos_id"],
                "pad_id": tok_meta["pad_id"],
                "tokenizer_sha256": tok_meta["sha256"],
                "seed": params.seed,
                "val_fraction": cfg.val_fraction,
                "repeat": cfg.repeat,
                "synthetic": manifest["synthetic"],
                **counts,
            }
            write_json(tmp / "meta.json", meta)
        run.log_metrics(counts)
        log.info(
            "pack: train %d tokens (%d docs), val %d tokens (%d docs), %s",
            counts["train"]["tokens"],
            counts["train"]["documents"],
            counts["val"]["tokens"],
            counts["val"]["documents"],
            meta["dtype"],
        )
        for source, tally in counts["sources"].items():
            times = cfg.repeat.get(source, 1)
            log.info(
                "pack: source %s: %d training tokens ×%d, %.1f %% of train",
                source,
                tally["tokens"],
                times,
                100 * tally["tokens"] * times / counts["train"]["tokens"],
            )


if __name__ == "__main__":
    run_main(main)
