"""The one temporary copy of the project for tests that run real DVC: dvc.yaml, params.yaml and the code
packages in a fresh git repo, and how to run commands in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from flows.common import stages_ran
from lmpipe.codedeps import PACKAGES
from tests.workdir import ROOT, suite_threads

PROJECT_FILES = ["dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".dvc/config", "pyproject.toml"]


def make_project(
    path: Path, edit: Callable[[dict[str, Any]], None] | None = None, packages: Sequence[str] = PACKAGES
) -> Path:
    """A git repo at `path` holding the project's pipeline (and `packages`: the stages' code, the
    flows' too where workers load them from the checkout); `edit` changes its params.yaml in place
    before the first commit."""
    path.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, path / name)
    for package in packages:
        shutil.copytree(ROOT / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
    edit_params(path, edit)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "project"]):
        subprocess.run(["git", *args], cwd=path, check=True, capture_output=True)
    return path


def edit_params(path: Path, edit: Callable[[dict[str, Any]], None] | None) -> None:
    """`edit` changes the params.yaml of the project at `path` in place (nothing when None)."""
    if edit is not None:
        params = yaml.safe_load((path / "params.yaml").read_text())
        edit(params)
        (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def tiny(params: dict[str, Any]) -> None:
    """The whole graph on one tiny encoder, one synthetic task and one seed: about a minute."""
    params["sample"]["documents"] = 300
    params["clean"]["workers"] = 1
    params["pretrain"]["threads"] = suite_threads()
    params["models"] = {"encoder_mlm": params["models"]["encoder_mlm"]}
    params["pretrain"].update(max_steps=10, warmup_steps=2, val_every=10, checkpoint_every=10)
    params["glue"]["tasks"] = ["stsb"]
    params["finetune"]["seeds"] = [1]
    params["finetune"]["tasks"]["stsb"].update(max_train_rows=64, epochs=1)


def tiny_project(path: Path, packages: Sequence[str] = PACKAGES) -> Path:
    return make_project(path, tiny, packages)


def reproduce_template(path: Path) -> Path:
    """The CI-sized project with the flows, the README and a test file beside the code, `dvc repro`-ed
    into its own MLflow store (`mlflow.db` in it): built once per session, read through copies."""
    project = make_project(path, tiny, (*PACKAGES, "flows"))
    shutil.copy(ROOT / "README.md", project / "README.md")
    (project / "tests").mkdir()
    shutil.copy(ROOT / "tests/test_codedeps.py", project / "tests/test_codedeps.py")
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "docs and tests")
    ran = stages_ran(sh(project, "dvc", "repro", MLFLOW_TRACKING_URI=None).stdout)
    assert "evaluate" in ran
    return project


# two points over two pretraining keys: the scratch baselines stay cached, every point pretrains,
# exports, fine-tunes and evaluates; the same points run locally and on a pool of workers compare equal
TWO_KEY_SWEEP = [
    {"objectives.mlm.mask_rate": 0.1, "pretrain.lr": 0.001},
    {"objectives.mlm.mask_rate": 0.3, "pretrain.lr": 0.002},
]


def sweep_template(template: Path, path: Path) -> Path:
    """A copy of the reproduced project with TWO_KEY_SWEEP run as the sweep `grid` by the command line
    (DVC experiments, the project's own MLflow store, Prefect in ephemeral mode under `path`): built
    once per session, read by the tests of a local sweep and compared with by the pooled one."""
    project = copy_project(template, path / "project")
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "baseline reproduced")
    command = [sys.executable, "-m", "flows.ablation", "--grid", json.dumps(TWO_KEY_SWEEP), "--name", "grid"]
    sh(
        project,
        *command,
        "--max-parallel",
        "2",
        MLFLOW_TRACKING_URI=None,
        PREFECT_API_URL=None,
        PREFECT_HOME=str(path / "prefect"),
    )
    return project


def copy_project(template: Path, path: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A copy of a project, its git history, DVC cache, outputs and MLflow store, to change freely;
    `edit` changes its params.yaml in place (uncommitted)."""
    shutil.copytree(template, path, symlinks=True)
    edit_params(path, edit)
    return path


def command_env(**env: str | None) -> dict[str, str]:
    """This environment with this venv's tools first on PATH; `env` adds variables (None removes one,
    e.g. MLFLOW_TRACKING_URI=None for the project's default store in the repo)."""
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    full_env["PYTHONPATH"] = str(ROOT)  # the flows' modules; `python -m stages.*` finds the copy first
    for key, value in env.items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return full_env


def sh(cwd: Path, *args: str, check: bool = True, **env: str | None) -> subprocess.CompletedProcess[str]:
    """A command in `cwd` (see `command_env` for `env`); with `check`, a failure fails the test."""
    result = subprocess.run(
        args, cwd=cwd, env=command_env(**env), capture_output=True, text=True, timeout=900
    )
    if check:
        assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def changed_deps(project: Path, *targets: str) -> dict[str, dict[str, str]]:
    """Stage -> {dependency: how it changed} as `dvc status` reports it (of `targets` and what they
    depend on, when given)."""
    args = ["--with-deps", *targets] if targets else []
    status = json.loads(sh(project, "dvc", "status", "--json", *args).stdout or "{}")
    return {
        stage: {
            path: how
            for change in changes
            if isinstance(change, dict)
            for path, how in change.get("changed deps", {}).items()
        }
        for stage, changes in status.items()
    }


def dvc(cwd: Path, *args: str) -> str:
    """A dvc command against the project's own MLflow store (mlflow.db in the repo): its output."""
    result = sh(cwd, "dvc", *args, MLFLOW_TRACKING_URI=None)
    return result.stdout + result.stderr


def dvc_stages(project: Path) -> set[str]:
    """Every stage of the project's graph, `foreach` expanded, as `dvc stage list` names them."""
    return set(sh(project, "dvc", "stage", "list", "--name-only").stdout.split())
