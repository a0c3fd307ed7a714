"""pandera schemas of the tables that pass between stages."""

from __future__ import annotations

import pandas as pd
import pandera.errors
import pandera.pandas as pa

from stages.common import StageError

DOCUMENTS = pa.DataFrameSchema(
    {
        "id": pa.Column(str, unique=True),
        "source": pa.Column(str, pa.Check.str_length(min_value=1)),
        "text": pa.Column(str, pa.Check.str_length(min_value=1)),
    },
    strict=True,
    ordered=True,
    name="documents",
)


def validate(schema: pa.DataFrameSchema, frame: pd.DataFrame, where: str) -> pd.DataFrame:
    try:
        return schema.validate(frame)
    except pandera.errors.SchemaError as exc:
        raise StageError(
            f"{where}: table fails the '{schema.name}' schema: {' '.join(str(exc).split())[:300]}"
        ) from None
