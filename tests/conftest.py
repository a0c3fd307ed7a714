"""The suite's fixtures: a private MLflow store, working directories with their own params.yaml, the
real-data folders, the reproduced CI-sized project. Helpers live in modules of their own."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.workdir import Workdir

CORES = len(os.sched_getaffinity(0))

# Each pytest-xdist worker and the stages it starts get their share of the cores (read by PyTorch when
# it starts, so set before any test module imports it). PyTorch's OpenMP threads spin while they
# wait: two workers training with a thread per core each run several times slower.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, CORES // workers))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: half a worker more than a worker per core, so that one test's wait on a server or a
    subprocess leaves no core idle (2-core Zen 4: 23.5 min of tests with three workers, 25.0 with
    two). PYTEST_XDIST_AUTO_NUM_WORKERS still decides where set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return CORES + CORES // 2


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
def sample_pipeline(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Workdir:
    """sample -> ingest -> clean -> tokenizer -> pack on the default params.

    Shared by several tests: a test that changes its params restores them.
    """
    return _prepared_copy(tmp_path_factory, worker_id, "sample_pipeline", None)


@pytest.fixture(scope="session")
def real_pipeline(tmp_path_factory: pytest.TempPathFactory, worker_id: str, corpus_dir: Path) -> Workdir:
    """ingest -> clean -> tokenizer -> pack on the real text in CORPUS_DIR."""
    return _prepared_copy(tmp_path_factory, worker_id, "real_pipeline", corpus_dir)


def _prepared_copy(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, corpus_dir: Path | None
) -> Workdir:
    """This worker's own copy of data stages run once per session (they take a core for 15-40 s)."""
    from tests.pipeline_helpers import prepared

    built = _once_per_session(tmp_path_factory, worker_id, name, lambda f: prepared(f, corpus_dir).path)
    return Workdir.copy_of(built, tmp_path_factory.mktemp(name) / "workdir")


def _once_per_session(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, build: Callable[[Path], Path]
) -> Path:
    """`build(folder)`'s result, built by the first pytest-xdist worker that needs it (the others wait
    for it) in a folder all workers share."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent  # the directory of the workers' base temps
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(shared / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(str(build(folder)))
    return Path(done.read_text())


@pytest.fixture(scope="session")
def reproduced_template(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The CI-sized project, reproduced once per session: never changed; tests take a `copy_project`."""
    from tests.project import reproduce_template

    return _once_per_session(
        tmp_path_factory, worker_id, "reproduced", lambda f: reproduce_template(f / "project")
    )


@pytest.fixture(scope="session")
def swept_template(
    reproduced_template: Path, tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> Path:
    """The reproduced project after the local sweep of TWO_KEY_SWEEP (`grid`), once per session: read
    only."""
    from tests.project import sweep_template

    return _once_per_session(
        tmp_path_factory, worker_id, "swept", partial(sweep_template, reproduced_template)
    )
