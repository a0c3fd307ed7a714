"""A CI-sized DVC project in a temporary git repo, for the Prefect flows' tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

PROJECT_FILES = ["dvc.yaml", "params.yaml", ".dvcignore", ".gitignore", ".dvc/config", "pyproject.toml"]


def sh(cwd: Path, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    full_env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=900)
    if check:
        assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def tiny_project(path: Path) -> Path:
    """The project's pipeline on one tiny encoder, one synthetic task and one seed: about a minute."""
    path.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, path / name)
    for package in ("stages", "models"):
        shutil.copytree(ROOT / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((path / "params.yaml").read_text())
    params["sample"]["documents"] = 300
    params["clean"]["workers"] = 1
    params["models"] = {"encoder_mlm": params["models"]["encoder_mlm"]}
    params["pretrain"].update(max_steps=10, warmup_steps=2, val_every=10, checkpoint_every=10)
    params["glue"]["tasks"] = ["stsb"]
    params["finetune"]["seeds"] = [1]
    params["finetune"]["tasks"]["stsb"].update(max_train_rows=64, epochs=1)
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(path, "git", "init", "-q", "-b", "main")
    sh(path, "git", "add", "-A")
    sh(path, "git", "commit", "-qm", "tiny project")
    return path
