"""Stage `hub@<name>`: the Hugging Face Hub dataset `hub.<name>`, pinned to a commit, ->
`data/hub/<name>` (a `save_to_disk` folder) and `metrics/hub/<name>.json` (what was read, its rows
and fingerprint).

The revision is a commit sha, a param of the stage: the same params always mean the same data, so
DVC's cache and run cache stay correct for a source that lives outside the machine. `ingest` reads
the folder as a `disk` source; `glue_prepare` reads a folder of them (one per task) as `disk`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lmpipe.data.hub import load
from lmpipe.layout import hub_dir, hub_metrics
from lmpipe.params.hub import HubParams
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections, SourceName
from lmpipe.runtime import StageError, atomic_dir, log, run_main, write_json
from lmpipe.tracking import stage_run, tracking_experiment


class HubSections(Sections):
    hub: dict[SourceName, HubParams] = {}


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    params = load_stage_params(HubSections)
    if len(args) != 1 or args[0] not in params.hub:
        known = ", ".join(params.hub) or "(none)"
        raise StageError(f"usage: python -m stages.hub <name>; the Hub datasets (hub) are: {known}")
    name = args[0]
    cfg = params.hub[name]
    tags = {"source": name}
    with stage_run("hub", tracking_experiment(), {"hub": {name: cfg.model_dump()}}, tags) as run:
        data = load(cfg, f"hub.{name}")
        splits = data if hasattr(data, "keys") else {cfg.split or "train": data}
        with atomic_dir(hub_dir(name)) as tmp:
            data.save_to_disk(str(tmp))
        report = {
            "dataset": cfg.dataset,
            "config": cfg.config,
            "revision": cfg.revision,
            "rows": {split: part.num_rows for split, part in splits.items()},
            "fingerprint": {split: part._fingerprint for split, part in splits.items()},
        }
        write_json(hub_metrics(name), report)
        run.log_metrics({"rows": report["rows"]})
        log.info("hub %s: %s at %s, rows %s", name, cfg.dataset, cfg.revision[:12], report["rows"])


if __name__ == "__main__":
    run_main(main)
