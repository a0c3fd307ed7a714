"""The data stages through real DVC in a real git repo: repro, no-op repro, partial re-runs, `dvc exp
run`, and one MLflow run per stage execution in the default embedded store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.project import dvc, make_project, sh, stages_ran


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("repo"))


def test_repro_then_nothing_then_only_what_changed(repo: Path) -> None:
    first = dvc(repo, "repro", "pack")
    assert stages_ran(first) == ["sample", "ingest@sample", "clean", "tokenizer", "pack"]
    meta = json.loads((repo / "data/tokens/meta.json").read_text())
    assert meta["synthetic"] is True and meta["train"]["tokens"] > 50_000

    second = dvc(repo, "repro", "pack")
    assert stages_ran(second) == []
    assert "Data and pipelines are up to date." in second

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["clean"]["min_words"] = 60
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = dvc(repo, "repro", "pack")
    assert stages_ran(third) == ["clean", "tokenizer", "pack"]
    report = json.loads((repo / "metrics/clean.json").read_text())
    assert report["dropped"]["too_few_words"] > 0
    sh(repo, "git", "commit", "-qam", "min_words 60")


def test_every_stage_execution_is_an_mlflow_run(repo: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    every = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    runs = [r for r in every if r.data.tags["stage"] != "pipeline"]
    stages = [r.data.tags["stage"] for r in runs]
    assert stages == ["sample", "ingest", "clean", "tokenizer", "pack", "clean", "tokenizer", "pack"]
    # each `dvc repro` (one commit and params.yaml) is one parent run in the UI, its stage runs under it
    parents = [r for r in every if r.data.tags["stage"] == "pipeline"]
    assert len(parents) == 2
    assert [r.data.tags["mlflow.parentRunId"] for r in runs] == [parents[0].info.run_id] * 5 + [
        parents[1].info.run_id
    ] * 3
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on its runs
    commit = sh(repo, "git", "rev-parse", "HEAD~1").stdout.strip()
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["git_commit"] == commit
        assert run.data.tags["data.synthetic"] == "True"
        assert run.data.metrics["duration_s"] > 0
    clean_runs = [r for r in runs if r.data.tags["stage"] == "clean"]
    assert [r.data.params["clean.min_words"] for r in clean_runs] == ["30", "60"]
    assert clean_runs[1].data.metrics["dropped.too_few_words"] > 0
    assert runs[-1].data.metrics["train.tokens"] > 0


def test_dvc_experiment_with_a_param_override(repo: Path) -> None:
    out = dvc(repo, "exp", "run", "-n", "fewer-words", "-S", "clean.min_words=20", "pack")
    assert stages_ran(out) == ["clean", "tokenizer", "pack"]
    shown = json.loads(dvc(repo, "exp", "show", "--json", "--no-fetch"))
    experiments = [e for rev in shown for e in (rev.get("experiments") or [])]
    names = {run["name"]: run for e in experiments for run in e.get("revs", [])}
    data = names["fewer-words"]["data"]
    assert data["params"]["params.yaml"]["data"]["clean"]["min_words"] == 20
    assert data["metrics"]["metrics/clean.json"]["data"]["documents_kept"] > 0
