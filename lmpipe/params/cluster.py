"""The `cluster` section: where the data stages run their shards."""

from __future__ import annotations

from pydantic import Field

from lmpipe.params.schema import Strict


class ClusterParams(Strict):
    """Where the data stages run their shards: every core here, or the workers of a Dask cluster. The
    outputs are the same bytes either way, so no stage depends on this section."""

    scheduler: str | None = Field(
        None,
        pattern=r"^(tcp|tls|inproc|ucx)://\S+$",
        description="a Dask scheduler's address (tcp://host:8786); its workers must see this folder",
    )
