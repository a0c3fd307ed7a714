"""The data stages through real DVC in a real git repo: repro, no-op repro, partial re-runs, `dvc exp
run`, and one MLflow run per stage execution in the default embedded store."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

PROJECT_FILES = ["dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".dvc/config", "pyproject.toml"]


def sh(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI")  # the project default: sqlite:///mlflow.db in the repo
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def stages_run(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    for name in PROJECT_FILES:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, path / name)
    for package in ("stages", "models"):
        shutil.copytree(ROOT / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
    sh(path, "git", "init", "-q", "-b", "main")
    sh(path, "git", "add", "-A")
    sh(path, "git", "commit", "-qm", "pipeline")
    return path


def test_repro_then_nothing_then_only_what_changed(repo: Path) -> None:
    first = sh(repo, "dvc", "repro", "pack")
    assert stages_run(first) == ["sample", "ingest", "clean", "tokenizer", "pack"]
    meta = json.loads((repo / "data/tokens/meta.json").read_text())
    assert meta["synthetic"] is True and meta["train"]["tokens"] > 50_000

    second = sh(repo, "dvc", "repro", "pack")
    assert stages_run(second) == []
    assert "Data and pipelines are up to date." in second

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["clean"]["min_words"] = 60
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = sh(repo, "dvc", "repro", "pack")
    assert stages_run(third) == ["clean", "tokenizer", "pack"]
    report = json.loads((repo / "metrics/clean.json").read_text())
    assert report["dropped"]["too_few_words"] > 0
    sh(repo, "git", "commit", "-qam", "min_words 60")


def test_every_stage_execution_is_an_mlflow_run(repo: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    stages = [r.data.tags["stage"] for r in runs]
    assert stages == ["sample", "ingest", "clean", "tokenizer", "pack", "clean", "tokenizer", "pack"]
    commit = sh(repo, "git", "rev-parse", "HEAD~1").strip()
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
    out = sh(repo, "dvc", "exp", "run", "-n", "fewer-words", "-S", "clean.min_words=20", "pack")
    assert stages_run(out) == ["clean", "tokenizer", "pack"]
    shown = json.loads(sh(repo, "dvc", "exp", "show", "--json", "--no-fetch"))
    experiments = [e for rev in shown for e in (rev.get("experiments") or [])]
    names = {run["name"]: run for e in experiments for run in e.get("revs", [])}
    data = names["fewer-words"]["data"]
    assert data["params"]["params.yaml"]["data"]["clean"]["min_words"] == 20
    assert data["metrics"]["metrics/clean.json"]["data"]["documents_kept"] > 0
