"""The end of the graph through real DVC: a CI-sized pretrained project switched to the real RTE files
re-runs only its GLUE stages; the real predictions, the report and a no-op second run (ablations
through DVC experiments: tests/test_flows.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml
from sklearn.metrics import accuracy_score

from tests.project import copy_project, dvc, stages_ran


def test_real_rte_end_to_end_through_dvc_repro(
    reproduced_template: Path, tmp_path: Path, glue_dir: Path
) -> None:
    repo = copy_project(reproduced_template, tmp_path / "repo")  # pretrained on the sample, synthetic STS-B
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["glue"] = {"source": "tsv", "path": str(glue_dir), "tasks": ["rte"], "synthetic": False}
    params["finetune"]["tasks"]["rte"].update(max_train_rows=128, epochs=1)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    # the GLUE copy and task changed: its stages re-run, the data stages and pretraining do not
    ran = stages_ran(dvc(repo, "repro"))
    assert set(ran) == {"glue_prepare", "finetune@encoder_mlm", "evaluate"}
    assert ran[0] == "glue_prepare" and ran[-1] == "evaluate"
    predictions = pd.read_parquet(repo / "data/finetune/encoder_mlm/pretrained/rte/seed1/validation.parquet")
    assert len(predictions) == 277 and set(predictions["prediction"]) <= {0, 1}  # the whole real dev set
    glue = json.loads((repo / "metrics/glue.json").read_text())
    labels = pd.read_csv(glue_dir / "RTE/dev.tsv", sep="\t", quoting=3)["label"] == "not_entailment"
    for init in ["pretrained", "scratch"]:
        found = pd.read_parquet(repo / f"data/finetune/encoder_mlm/{init}/rte/seed1/validation.parquet")
        expected = 100 * accuracy_score(labels.astype(int), found["prediction"])
        assert abs(glue["encoder_mlm"][init]["rte"] - expected) < 1e-9  # real predictions, sklearn's score
        assert glue["encoder_mlm"][init]["average"] == glue["encoder_mlm"][init]["rte"]
    report = (repo / "reports/glue.md").read_text()
    assert "Synthetic" not in report and "| Model | Init | RTE Acc | Average |" in report
    shown = dvc(repo, "metrics", "show", "--json")
    assert "encoder_mlm" in json.loads(shown)[""]["data"]["metrics/glue.json"]["data"]

    assert stages_ran(dvc(repo, "repro")) == []
