"""The end of the graph through real DVC: a CI-sized pretrain + fine-tune on the real RTE files, the
report and a no-op second run (ablations through DVC experiments: tests/test_flows.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from sklearn.metrics import accuracy_score

from tests.project import make_project, sh, stages_run


def dvc(cwd: Path, *args: str) -> str:
    result = sh(cwd, "dvc", *args, MLFLOW_TRACKING_URI=None)  # the project default: mlflow.db in the repo
    return result.stdout + result.stderr


def test_real_rte_end_to_end_through_dvc_repro(tmp_path: Path, glue_dir: Path) -> None:
    def real_rte(params: dict) -> None:
        params["models"] = {"encoder_mlm": {"arch": "encoder", "objective": "mlm", "preset": "tiny"}}
        params["sample"]["documents"] = 300  # the corpus is only there to pretrain on
        params["pretrain"].update(max_steps=10, warmup_steps=2, val_every=10, checkpoint_every=10)
        params["glue"] = {"source": "tsv", "path": str(glue_dir), "tasks": ["rte"], "synthetic": False}
        params["finetune"]["seeds"] = [1]
        params["finetune"]["tasks"]["rte"].update(max_train_rows=128, epochs=1)

    repo = make_project(tmp_path / "repo", real_rte)

    ran = stages_run(dvc(repo, "repro"))
    first = [stage for stage in ran if stage != "export@encoder_mlm"]
    assert "export@encoder_mlm" in ran
    assert (
        first[-4:]
        == [
            "pretrain@encoder_mlm",
            "finetune@encoder_mlm-rte",
            "finetune_scratch@encoder_mlm-rte",
            "evaluate",
        ]
        and "glue_prepare" in first
    )
    predictions = pd.read_parquet(repo / "data/finetune/encoder_mlm/rte/pretrained/seed1/validation.parquet")
    assert len(predictions) == 277 and set(predictions["prediction"]) <= {0, 1}  # the whole real dev set
    glue = json.loads((repo / "metrics/glue.json").read_text())
    labels = pd.read_csv(glue_dir / "RTE/dev.tsv", sep="\t", quoting=3)["label"] == "not_entailment"
    for init in ["pretrained", "scratch"]:
        found = pd.read_parquet(repo / f"data/finetune/encoder_mlm/rte/{init}/seed1/validation.parquet")
        expected = 100 * accuracy_score(labels.astype(int), found["prediction"])
        assert abs(glue["encoder_mlm"][init]["rte"] - expected) < 1e-9  # real predictions, sklearn's score
        assert glue["encoder_mlm"][init]["average"] == glue["encoder_mlm"][init]["rte"]
    report = (repo / "reports/glue.md").read_text()
    assert "Synthetic" not in report and "| Model | Init | RTE Acc | Average |" in report
    shown = dvc(repo, "metrics", "show", "--json")
    assert "encoder_mlm" in json.loads(shown)[""]["data"]["metrics/glue.json"]["data"]

    assert stages_run(dvc(repo, "repro")) == []
