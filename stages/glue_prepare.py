"""Stage `glue_prepare`: the GLUE tasks of `glue.tasks` -> `data/glue/<task>/<split>.parquet`.

From a folder in the original TSV layout (download_glue_data.py's), or from a folder of
`DatasetDict.save_to_disk` folders, one per task (the `hub` stage writes them from `nyu-mll/glue`).
`glue.path` is the stage's dependency in dvc.yaml: DVC hashes the folder, so an edited TSV re-runs it.
Every table is checked by a pandera schema of its task; labels use the Hub's ids.
"""

from __future__ import annotations

from lmpipe.glue.prepare import read_task
from lmpipe.glue.tasks import task as glue_task
from lmpipe.layout import GLUE
from lmpipe.params.glue import GlueParams
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.runtime import atomic_dir, log, run_main, write_json
from lmpipe.schemas import glue_schema, validate
from lmpipe.tracking import stage_run, tracking_experiment


class GlueSections(Sections):
    glue: GlueParams = GlueParams(path="data/sample/glue", synthetic=True)


def main() -> None:
    params = load_stage_params(GlueSections)
    cfg = params.glue
    specs = [glue_task(name, f"glue.tasks[{i}]") for i, name in enumerate(cfg.tasks)]
    with stage_run(
        "glue_prepare",
        tracking_experiment(),
        {"glue": cfg.model_dump()},
        {"data.synthetic": cfg.synthetic},
    ) as run:
        counts: dict[str, dict[str, int]] = {}
        with atomic_dir(GLUE) as tmp:
            for spec in specs:
                (tmp / spec.name).mkdir()
                for split, frame in read_task(cfg, spec).items():
                    where = f"{spec.name}/{split} from {cfg.source} {cfg.path}"
                    validate(glue_schema(spec), frame, where).to_parquet(
                        tmp / spec.name / f"{split}.parquet", index=False
                    )
                    counts.setdefault(spec.name, {})[split] = len(frame)
            write_json(
                tmp / "manifest.json", {"source": cfg.source, "synthetic": cfg.synthetic, "rows": counts}
            )
        run.log_metrics({"rows": counts})
        log.info("glue_prepare: %s", ", ".join(f"{t} {r}" for t, r in counts.items()))


if __name__ == "__main__":
    run_main(main)
