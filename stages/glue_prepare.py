"""Stage `glue_prepare`: the GLUE tasks of `glue.tasks` -> `data/glue/<task>/<split>.parquet`.

From a folder in the original TSV layout (download_glue_data.py's), or from a folder of
`DatasetDict.save_to_disk` folders, one per task (the `hub` stage writes them from `nyu-mll/glue`).
`glue.path` is the stage's dependency in dvc.yaml: DVC hashes the folder, so an edited TSV re-runs it.
Every table is checked by a pandera schema of its task; labels use the Hub's ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lmpipe.glue.tasks import GlueTask, read_tsv
from lmpipe.glue.tasks import task as glue_task
from lmpipe.layout import GLUE
from lmpipe.params.glue import GlueParams
from lmpipe.params.project import load_stage_params
from lmpipe.params.schema import Sections
from lmpipe.runtime import StageError, atomic_dir, log, run_main, write_json
from lmpipe.schemas import glue_schema, validate
from lmpipe.tracking import stage_run, tracking_experiment


class GlueSections(Sections):
    glue: GlueParams = GlueParams(path="data/sample/glue", synthetic=True)


def from_datasets(data: object, spec: GlueTask, where: str, splits: Sequence[str]) -> dict[str, pd.DataFrame]:
    import datasets

    if not isinstance(data, datasets.DatasetDict):
        raise StageError(f"{where}: expected a DatasetDict with splits {', '.join(splits)}")
    frames = {}
    for split in splits:
        if split not in data:
            raise StageError(f"{where}: no split '{split}'; its splits are: {', '.join(data)}")
        table = data[split]
        missing = [c for c in (*spec.text_columns, "label") if c not in table.column_names]
        if missing:
            raise StageError(
                f"{where}/{split}: missing column(s) {', '.join(missing)}; "
                f"its columns are: {', '.join(table.column_names)}"
            )
        frame = table.select_columns([*spec.text_columns, "label"]).to_pandas()
        frame.insert(0, "idx", range(len(frame)))
        frames[split] = frame.astype({"label": "float64" if spec.is_regression else "int64"})
    return frames


def read_task(
    cfg: GlueParams, spec: GlueTask, splits: Sequence[str] | None = None
) -> dict[str, pd.DataFrame]:
    """The task's splits (all by default) as `idx, <text columns>, label` tables."""
    splits = list(spec.splits) if splits is None else splits
    if cfg.source == "tsv":
        folder = Path(cfg.path) / spec.folder
        return {split: read_tsv(folder / spec.splits[split], spec) for split in splits}
    import datasets

    where = str(Path(cfg.path) / spec.name)
    try:
        data = datasets.load_from_disk(where)
    except FileNotFoundError:
        raise StageError(f"{where}: not a datasets save_to_disk folder (glue.path)") from None
    return from_datasets(data, spec, where, splits)


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
