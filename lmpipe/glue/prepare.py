"""What stage `glue_prepare` is made of: each GLUE task read from TSV files or `save_to_disk`
folders, validated and written as parquet."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lmpipe.glue.tasks import GlueTask, read_tsv
from lmpipe.params.glue import GlueParams
from lmpipe.runtime import StageError


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
