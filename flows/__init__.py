"""Prefect flows over the DVC pipeline: `flows.pipeline` (the graph) and `flows.ablation` (sweeps)."""

import os

# Everything stays on 127.0.0.1: Prefect's server would otherwise try to send usage telemetry.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Without PREFECT_API_URL a flow starts a temporary server, which first migrates a new SQLite
# database: on 2 busy cores that took longer than Prefect's 20 s default (a test run, 2026-11-26)
EPHEMERAL_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
os.environ.setdefault(EPHEMERAL_TIMEOUT_ENV, "120")
