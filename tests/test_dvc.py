"""The data stages through real DVC in a real git repo: repro, no-op repro, partial re-runs, `dvc exp
run`, and one MLflow run per stage execution in the default embedded store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.project import dvc, make_project, sh, stages_ran


@dataclass
class History:
    """One project's life through real DVC, run once for the module's tests to read: a repro, the same
    repro again, one param edited, committed, then a `dvc exp run` overriding another value."""

    repo: Path
    first: str
    second: str
    third: str
    experiment: str


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    repo = make_project(tmp_path_factory.mktemp("repo"))
    first, second = dvc(repo, "repro", "pack"), dvc(repo, "repro", "pack")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["clean"]["min_words"] = 60
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = dvc(repo, "repro", "pack")
    sh(repo, "git", "commit", "-qam", "min_words 60")
    experiment = dvc(repo, "exp", "run", "-n", "fewer-words", "-S", "clean.min_words=20", "pack")
    return History(repo, first, second, third, experiment)


def test_repro_then_nothing_then_only_what_changed(history: History) -> None:
    assert stages_ran(history.first) == ["sample", "ingest@sample", "clean", "tokenizer", "pack"]
    assert stages_ran(history.second) == []
    assert "Data and pipelines are up to date." in history.second
    assert stages_ran(history.third) == ["clean", "tokenizer", "pack"]
    meta = json.loads((history.repo / "data/tokens/meta.json").read_text())
    assert meta["synthetic"] is True and meta["train"]["tokens"] > 50_000


def test_every_stage_execution_is_an_mlflow_run(history: History) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{history.repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    every = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    runs = [r for r in every if r.data.tags["stage"] != "pipeline"]
    stages = [r.data.tags["stage"] for r in runs]
    assert stages == ["sample", "ingest", "clean", "tokenizer", "pack"] + ["clean", "tokenizer", "pack"] * 2
    # each `dvc repro` or `dvc exp run` (one commit and params.yaml) is one parent run in the UI, its
    # stage runs under it
    parents = [r.info.run_id for r in every if r.data.tags["stage"] == "pipeline"]
    assert len(parents) == 3
    assert [r.data.tags["mlflow.parentRunId"] for r in runs] == [parents[0]] * 5 + [parents[1]] * 3 + [
        parents[2]
    ] * 3
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on its runs
    commits = [sh(history.repo, "git", "rev-parse", rev).stdout.strip() for rev in ("HEAD~1", "HEAD")]
    assert [r.data.tags["git_commit"] for r in runs] == [commits[0]] * 8 + [commits[1]] * 3
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["data.synthetic"] == "True"
        assert run.data.metrics["duration_s"] > 0
    clean_runs = [r for r in runs if r.data.tags["stage"] == "clean"]
    assert [r.data.params["clean.min_words"] for r in clean_runs] == ["30", "60", "20"]
    assert clean_runs[1].data.metrics["dropped.too_few_words"] > 0
    assert runs[-1].data.metrics["train.tokens"] > 0


def test_dvc_experiment_with_a_param_override(history: History) -> None:
    assert stages_ran(history.experiment) == ["clean", "tokenizer", "pack"]
    shown = json.loads(dvc(history.repo, "exp", "show", "--json", "--no-fetch"))
    experiments = [e for rev in shown for e in (rev.get("experiments") or [])]
    names = {run["name"]: run for e in experiments for run in e.get("revs", [])}
    data = names["fewer-words"]["data"]
    assert data["params"]["params.yaml"]["data"]["clean"]["min_words"] == 20
    assert data["metrics"]["metrics/clean.json"]["data"]["documents_kept"] > 0
