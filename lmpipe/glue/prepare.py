"""What stage `glue_prepare` is made of: each GLUE task read from the original TSV files or
`save_to_disk` folders, validated and written as parquet."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from lmpipe.glue.tasks import GlueTask
from lmpipe.params.glue import GlueParams
from lmpipe.runtime import StageError


def _label_id(task: GlueTask, raw: str, where: str) -> float | int:
    if task.labels is None:
        try:
            return float(raw)
        except ValueError:
            raise StageError(
                f"{where}: label '{raw}' is not a number ({task.name} is a regression task)"
            ) from None
    if raw in task.labels:  # MNLI, QNLI, RTE spell their labels out
        return task.labels.index(raw)
    if raw.isdigit() and int(raw) < len(task.labels):
        return int(raw)
    allowed = ", ".join([*task.labels, *map(str, range(len(task.labels)))])
    raise StageError(f"{where}: label '{raw}' is not one of {task.name}'s labels ({allowed})")


def read_tsv(path: Path, task: GlueTask) -> pd.DataFrame:
    """One split in the original GLUE TSV layout -> `idx, <text columns>, label`.

    Fields are split on tabs only: GLUE's sentences hold unbalanced quotes that a CSV reader would
    take for quoting and merge rows over.
    """
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except FileNotFoundError:
        raise StageError(
            f"{path}: missing (expected the {task.folder} folder of download_glue_data.py)"
        ) from None
    except UnicodeDecodeError as exc:
        raise StageError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if lines and lines[-1] == "":
        lines.pop()
    if task.header:
        if not lines:
            raise StageError(f"{path}: empty file, expected a header line")
        columns = lines[0].rstrip("\r").split("\t")
        wanted = [*task.tsv_text, task.tsv_label]
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise StageError(
                f"{path}: missing column(s) {', '.join(map(str, missing))}; "
                f"the header has: {', '.join(map(str, columns))}"
            )
        positions = [columns.index(c) for c in wanted]
    else:
        positions = [int(c) for c in (*task.tsv_text, task.tsv_label)]
    needed = max(positions) + 1
    rows = []
    body, first_line = (lines[1:], 2) if task.header else (lines, 1)
    for number, line in enumerate(body, start=first_line):
        fields = line.rstrip("\r").split("\t")
        where = f"{path}:{number}"
        if len(fields) < needed:
            raise StageError(f"{where}: {len(fields)} tab-separated fields, expected at least {needed}")
        *texts, label = (fields[p] for p in positions)
        rows.append((len(rows), *texts, _label_id(task, label.strip(), where)))
    if not rows:
        raise StageError(f"{path}: no rows (an empty split)")
    frame = pd.DataFrame(rows, columns=["idx", *task.text_columns, "label"])
    return frame.astype({"label": "float64" if task.is_regression else "int64"})


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
