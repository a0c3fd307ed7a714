"""`hub@<name>`: a dataset pinned to a commit, saved for `ingest` (a `disk` source) and `glue_prepare`.

The tests never reach the Hub: a local dataset folder stands in for the Hub id (datasets loads both
through the same call), and the offline case checks the one-line error a user without network gets.
"""

from __future__ import annotations

import json

from stages import hub, ingest

SHA = "0123456789abcdef0123456789abcdef01234567"
PARA = "The committee met on Tuesday and agreed on a plan for the new library building."


def test_a_pinned_dataset_is_saved_and_ingested_as_a_disk_source(workdir) -> None:
    folder = workdir.path / "local_dataset"
    folder.mkdir()
    rows = "".join(json.dumps({"text": f"{PARA} {i}", "label": i % 2}) + "\n" for i in range(6))
    (folder / "train.jsonl").write_text(rows)
    workdir.write_params(
        hub={
            "whole": {"dataset": str(folder), "revision": SHA},
            "head": {"dataset": str(folder), "split": "train", "revision": SHA, "max_documents": 4},
        }
    )
    hub.main(["whole"])
    hub.main(["head"])
    whole = json.loads((workdir.path / "metrics/hub/whole.json").read_text())
    assert whole["revision"] == SHA and whole["rows"] == {"train": 6} and whole["fingerprint"]["train"]
    assert json.loads((workdir.path / "metrics/hub/head.json").read_text())["rows"] == {"train": 4}

    workdir.sources(**{name: {"kind": "disk", "path": f"data/hub/{name}"} for name in ("whole", "head")})
    for name, documents in (("whole", 6), ("head", 4)):
        ingest.main([name])
        report = json.loads((workdir.path / f"metrics/ingest/{name}.json").read_text())
        assert report["documents"] == documents


def test_offline_or_unknown_dataset_is_one_line_and_no_output(workdir) -> None:
    workdir.write_params(hub={"c4": {"dataset": "allenai/c4", "config": "en", "revision": SHA}})
    result = workdir.run("hub", "c4")
    assert result.returncode == 2
    expected = f"error: hub.c4 (Hub dataset 'allenai/c4' at {SHA[:12]}): cannot load: Couldn't reach"
    assert result.stderr.strip().splitlines()[-1].startswith(f"{expected} 'allenai/c4'")
    assert "Traceback" not in result.stderr
    assert not (workdir.path / "data/hub").exists() and not (workdir.path / "metrics/hub").exists()
    result = workdir.run("hub", "c5")
    assert result.returncode == 2 and "the Hub datasets (hub) are: c4" in result.stderr
