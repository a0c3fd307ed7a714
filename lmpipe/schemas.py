"""pandera schemas of the tables that pass between stages."""

from __future__ import annotations

import pandas as pd
import pandera.errors
import pandera.pandas as pa
import pyarrow as arrow

from lmpipe.runtime import StageError

NO_META = "{}"
DOCUMENTS = pa.DataFrameSchema(
    {
        "id": pa.Column(str, unique=True),
        "source": pa.Column(str, pa.Check.str_length(min_value=1)),
        "text": pa.Column(str, pa.Check.str_length(min_value=1)),
        # a JSON object: what the reader knew of the document (a Wikipedia article's title and url,
        # the part of a Project Gutenberg book), NO_META when nothing
        "meta": pa.Column(str, pa.Check.str_startswith("{")),
    },
    strict=True,
    ordered=True,
    name="documents",
)
# the documents' parquet files (ingest's and clean's)
DOCUMENT_COLUMNS = list(DOCUMENTS.columns)
DOCUMENTS_ARROW = arrow.schema([(column, arrow.string()) for column in DOCUMENT_COLUMNS])


def validate(schema: pa.DataFrameSchema, frame: pd.DataFrame, where: str) -> pd.DataFrame:
    try:
        return schema.validate(frame)
    except pandera.errors.SchemaError as exc:
        cases, column = exc.failure_cases, getattr(exc, "column_name", None)
        if isinstance(cases, pd.DataFrame) and len(cases) and "index" in cases and column:
            first = cases.iloc[0]
            value = getattr(first["failure_case"], "item", lambda: first["failure_case"])()
            check = getattr(exc.check, "error", None) or exc.check
            raise StageError(
                f"{where}: row {first['index']}: {column}={value!r} fails {check} "
                f"({len(cases)} row(s) in all; schema '{schema.name}')"
            ) from None
        raise StageError(
            f"{where}: table fails the '{schema.name}' schema: {' '.join(str(exc).split())[:300]}"
        ) from None


def glue_schema(task: object) -> pa.DataFrameSchema:
    """One GLUE split: idx, the task's text columns, and a label in its set (or 0..5 for STS-B)."""
    label = (
        pa.Column(float, pa.Check.in_range(0.0, 5.0))
        if task.is_regression
        else pa.Column(int, pa.Check.isin(list(range(len(task.labels)))))
    )
    columns = {
        "idx": pa.Column(int, unique=True),
        **{c: pa.Column(str) for c in task.text_columns},
        "label": label,
    }
    return pa.DataFrameSchema(columns, strict=True, ordered=True, name=f"glue {task.name}")
