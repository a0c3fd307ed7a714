"""A data stage's progress where nobody watches a terminal: the logs of `dvc repro`, Prefect and CI."""

from __future__ import annotations

import logging

from lmpipe.data.progress import Meter


def test_progress_lines_in_logs_every_interval_with_rates_drops_and_eta(caplog) -> None:
    now = [0.0]
    meter = Meter("clean", total_docs=1000, every=30.0, clock=lambda: now[0], terminal=False)
    with caplog.at_level(logging.INFO, logger="lmpipe"):
        for _ in range(10):  # 100 documents of 2,000 characters every 10 s, a fifth dropped
            now[0] += 10.0
            meter.update(docs=100, nbytes=200_000, dropped=20)
        meter.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4  # at 30, 60 and 90 s, and the last
    assert lines[0] == "clean: 300 documents, 10 docs/s, 0.02 MB/s, 20.0% dropped, 30% done, ETA 1 min 10 s"
    assert lines[-1].endswith("100% done, ETA 0 min 00 s (finished)")
