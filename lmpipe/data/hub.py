"""What stage `hub@<name>` is made of: a Hugging Face Hub dataset at a pinned commit."""

from __future__ import annotations

from typing import Any

from lmpipe.params.hub import HubParams
from lmpipe.runtime import StageError


def load(cfg: HubParams, key: str) -> Any:
    """The pinned dataset: a DatasetDict of every split, or the one `split` as a Dataset."""
    import datasets  # slow to import; only this stage and some sources need it

    where = f"{key} (Hub dataset '{cfg.dataset}' at {cfg.revision[:12]})"
    try:
        data = datasets.load_dataset(
            cfg.dataset,
            cfg.config,
            split=cfg.split,
            revision=cfg.revision,
            data_files=cfg.data_files,
            streaming=cfg.max_documents is not None,
        )
    except Exception as exc:  # datasets raises many types: offline, unknown dataset, config or revision
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StageError(f"{where}: cannot load: {first_line}") from None
    if cfg.max_documents is not None:  # a streamed split: its first rows only
        rows = list(data.take(cfg.max_documents))
        if not rows:
            raise StageError(f"{where}: split '{cfg.split}' has no rows")
        data = datasets.Dataset.from_list(rows)
    return data
