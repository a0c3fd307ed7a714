"""Profiles: the real-data profile, CI-sized, as one DVC experiment on CORPUS_DIR and GLUE_DIR; the
workspace keeps the offline default; bad input is one line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import dvc.api
import mlflow
import pytest
import yaml

from flows import profile
from flows.common import PipelineError
from tests.conftest import ROOT
from tests.project import sh, tiny_project

# the profile at CI size: one tiny encoder, two real tasks cut down, two seeds, a small vocabulary
CI_SIZE = [
    "~models.decoder_clm",
    "~models.encdec_span",
    "~pretrain.models.decoder_clm",
    "~pretrain.models.encdec_span",
    "++models.encoder_mlm.preset=tiny",
    "++tokenizer.vocab_size=2000",
    "++pretrain.max_steps=20",
    "++pretrain.warmup_steps=5",
    "++pretrain.val_every=10",
    "++pretrain.checkpoint_every=10",
    "++glue.tasks=[sst2,rte]",
    "++finetune.seeds=[1,2]",
    "++finetune.tasks.sst2.max_train_rows=300",
    "++finetune.tasks.sst2.epochs=1",
    "++finetune.tasks.rte.max_train_rows=200",
    "++finetune.tasks.rte.epochs=1",
]


def test_every_profile_is_valid_params() -> None:
    assert "real-cpu" in profile.available()
    for name in profile.available():
        overrides = profile.overrides(name, corpus=str(ROOT), glue=str(ROOT))
        params = profile.validate(ROOT, overrides, f"profile {name}")
        assert not params.glue.synthetic


def test_profile_input_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="profile 'real-gpu' is unknown"):
        profile.overrides("real-gpu")
    with pytest.raises(PipelineError, match="profile 'real-cpu' reads corpus data: give --corpus"):
        profile.overrides("real-cpu", glue=str(tmp_path))
    with pytest.raises(PipelineError, match="--glue .*/missing: not a directory"):
        profile.overrides("real-cpu", corpus=str(tmp_path), glue=str(tmp_path / "missing"))
    given = [*profile.overrides("real-cpu", str(tmp_path), str(tmp_path)), "++pretrain.max_steps=0"]
    with pytest.raises(PipelineError, match=r"pretrain.max_steps=0: Input should be greater than or equal"):
        profile.validate(ROOT, given, "profile real-cpu")
    result = sh(ROOT, sys.executable, "-m", "flows.profile", "real-cpu", "--glue", str(tmp_path), check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: profile 'real-cpu' reads corpus data: give --corpus <folder>"


def test_real_profile_runs_the_graph_as_one_experiment_with_verdicts(
    tmp_path: Path, corpus_dir: Path, glue_dir: Path
) -> None:
    project = tiny_project(tmp_path / "project")
    default_params = (project / "params.yaml").read_text()
    store = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, "-m", "flows.profile", "real-cpu", "--repo", str(project), "--name", "real-ci"]
    command += ["--corpus", str(corpus_dir), "--glue", str(glue_dir)]
    for override in CI_SIZE:
        command += ["-S", override]
    result = sh(project, *command, MLFLOW_TRACKING_URI=store)
    assert "GLUE report:" in result.stdout and "| encoder_mlm (encoder, mlm) | pretrained |" in result.stdout

    # the workspace keeps the offline default; the experiment holds the real-data run
    assert (project / "params.yaml").read_text() == default_params
    params = yaml.safe_load(dvc.api.read("params.yaml", repo=str(project), rev="real-ci"))
    assert params["glue"]["path"] == str(glue_dir.resolve()) and params["glue"]["synthetic"] is False
    assert list(params["ingest"]["sources"]) == ["corpus"]  # the profile's source replaces the sample
    assert params["ingest"]["sources"]["corpus"]["path"] == str(corpus_dir.resolve())
    shown = {row["Experiment"]: row for row in dvc.api.exp_show(repo=str(project)) if row["Experiment"]}
    assert shown["real-ci"]["pretrain.precision"] == "bf16-mixed"

    out = project / "reports/profiles/real-ci"
    report = (out / "glue.md").read_text()
    assert "Synthetic" not in report and "SST-2 Acc" in report and "RTE Acc" in report
    glue = json.loads((out / "glue.json").read_text())["encoder_mlm"]
    for key in ("sst2", "rte", "average"):
        assert glue["verdict"][key] in ("better", "worse", "within noise")
        assert glue["delta_low"][key] <= glue["delta"][key] <= glue["delta_high"][key]
    assert "paired bootstrap over dev examples" in report and "## In short" in report
    assert shown["real-ci"]["encoder_mlm.delta_low.average"] == pytest.approx(glue["delta_low"]["average"])
    assert (out / "glue.png").read_bytes().startswith(b"\x89PNG")

    # MLflow: the stage runs of the experiment nest under the profile's run
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("lmpipe")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.stage = 'profile'")
    children = client.search_runs(
        [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    stages = {run.data.tags["stage"] for run in children}
    assert {"ingest", "clean", "tokenizer", "pack", "pretrain", "finetune", "evaluate"} <= stages
    assert all(run.data.tags.get("dvc_experiment") == "real-ci" for run in children)
    assert os.environ["MLFLOW_TRACKING_URI"] != store  # the suite's own store was left alone
