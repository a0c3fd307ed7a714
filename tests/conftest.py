"""Shared fixtures: a private MLflow store, a working directory with its own params.yaml, data dirs."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


@pytest.fixture(scope="session", autouse=True)
def _isolated_services(tmp_path_factory: pytest.TempPathFactory) -> None:
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}"
    os.environ["DVC_NO_ANALYTICS"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("GIT_AUTHOR_NAME", "test")
    os.environ.setdefault("GIT_AUTHOR_EMAIL", "test@example.com")
    os.environ.setdefault("GIT_COMMITTER_NAME", "test")
    os.environ.setdefault("GIT_COMMITTER_EMAIL", "test@example.com")


class Workdir:
    """A temporary project directory: params.yaml and data/, where stages run as in the repo."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.params = copy.deepcopy(DEFAULT_PARAMS)
        self.params["clean"]["workers"] = 1  # worker pools are tested on their own
        self.write_params()

    def write_params(self, **sections: object) -> None:
        self.params.update(sections)
        (self.path / "params.yaml").write_text(yaml.safe_dump(self.params, sort_keys=False))

    def set(self, dotted: str, value: object) -> None:
        *parents, last = dotted.split(".")
        node = self.params
        for key in parents:
            node = node[key]
        node[last] = value
        self.write_params()

    @contextlib.contextmanager
    def changed(self, overrides: dict[str, object]) -> Iterator[None]:
        """Params set by dotted key for the block, restored after it (for shared workdirs)."""
        saved = copy.deepcopy(self.params)
        for dotted, value in overrides.items():
            self.set(dotted, value)
        try:
            yield
        finally:
            self.params = saved
            self.write_params()

    def sources(self, **sources: dict) -> None:
        """`ingest.sources`, by name."""
        self.params["ingest"]["sources"] = sources
        self.write_params()

    def run(self, stage: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`python -m stages.<stage>` as DVC runs it: a real process, exit code and stderr."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(
            [sys.executable, "-m", f"stages.{stage}", *args],
            cwd=self.path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workdir:
    monkeypatch.chdir(tmp_path)
    return Workdir(tmp_path)


def _data_dir(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.skip(f"{variable} is not set (CI points it at ../shared/data); real-data test skipped")
    path = Path(value)
    if not path.is_dir():
        pytest.skip(f"{variable}={value} is not a directory; real-data test skipped")
    return path


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    return _data_dir("CORPUS_DIR")


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    return _data_dir("GLUE_DIR")


@pytest.fixture(scope="session")
def sample_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Workdir:
    """sample -> ingest -> clean -> tokenizer -> pack on the default params.

    Shared by several tests: a test that changes its params restores them.
    """
    from tests.pipeline_helpers import prepared

    return prepared(tmp_path_factory.mktemp("sample_pipeline"), None)


@pytest.fixture(scope="session")
def real_pipeline(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> Workdir:
    """ingest -> clean -> tokenizer -> pack on the real text in CORPUS_DIR."""
    from tests.pipeline_helpers import prepared

    return prepared(tmp_path_factory.mktemp("real_pipeline"), corpus_dir)


@pytest.fixture(scope="session")
def reproduced_template(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The CI-sized project, reproduced once per session (by the first pytest-xdist worker that needs
    it, the others wait for it): never changed; tests take a `copy_project`."""
    from filelock import FileLock

    from tests.project import reproduce_template

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the directory of the workers' base temps
    project, done = shared / "reproduced" / "project", shared / "reproduced.done"
    with FileLock(shared / "reproduced.lock"):
        if not done.exists():
            shutil.rmtree(project.parent, ignore_errors=True)
            reproduce_template(project)
            done.touch()
    return project
