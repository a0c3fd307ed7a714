"""The presets' runs on real text, from their sweeps' MLflow parent runs: each finished sweep named
<prefix><preset>, with its points, wall time and day, written to docs/results/presets-on-real-text.csv,
which the README's status table reads (`python -m flows.presets --write`).

    python -m docs.results.real_text_runs --tracking sqlite:///<project>/mlflow.db --prefix smoke- \
        --cpu "2-core AMD EPYC (Zen 4)"

(from the project's root, with its venv). A preset run again replaces its row; other rows are kept.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from lmpipe.tracking import tracking_experiment

CSV = Path(__file__).resolve().parent / "presets-on-real-text.csv"
FIELDS = ("preset", "points", "minutes", "day", "cpu", "sweep")


def read(path: Path = CSV) -> dict[str, dict[str, str]]:
    """preset -> its row."""
    if not path.exists():
        return {}
    with path.open(newline="") as handle:
        return {row["preset"]: row for row in csv.DictReader(handle)}


def finished_sweeps(tracking: str, experiment: str, prefix: str, cpu: str) -> dict[str, dict[str, str]]:
    """preset -> the row of its finished sweep named <prefix><preset> (the latest, if run twice)."""
    client = MlflowClient(tracking)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"{tracking}: no MLflow experiment '{experiment}'")
    query = f"tags.stage = 'ablation' and attributes.status = 'FINISHED' and tags.sweep LIKE '{prefix}%'"
    rows: dict[str, dict[str, str]] = {}
    for run in client.search_runs([found.experiment_id], query, order_by=["attributes.start_time ASC"]):
        preset = run.data.tags.get("preset")
        if preset is None or run.data.tags["sweep"] != f"{prefix}{preset}":
            continue
        start = dt.datetime.fromtimestamp(run.info.start_time / 1000, dt.UTC)
        rows[preset] = {
            "preset": preset,
            "points": str(int(run.data.metrics["points"])),
            "minutes": f"{(run.info.end_time - run.info.start_time) / 60_000:.1f}",
            "day": start.date().isoformat(),
            "cpu": cpu,
            "sweep": run.data.tags["sweep"],
        }
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking", required=True, help="the MLflow tracking URI of the sweeps")
    parser.add_argument("--experiment", default=None, help="the MLflow experiment (default: params.yaml's)")
    parser.add_argument("--prefix", required=True, help="the sweeps' names: <prefix><preset>")
    parser.add_argument("--cpu", required=True, help="the machine they ran on, in words")
    args = parser.parse_args(argv)
    rows = read() | finished_sweeps(
        args.tracking, args.experiment or tracking_experiment(), args.prefix, args.cpu
    )
    with CSV.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows[preset] for preset in sorted(rows))
    print(f"{CSV.name}: {len(rows)} presets")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
