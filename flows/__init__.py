"""Prefect flows over the DVC pipeline: `flows.pipeline` (the graph) and `flows.ablation` (sweeps)."""

import os

# Everything stays on 127.0.0.1: Prefect's server would otherwise try to send usage telemetry.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
