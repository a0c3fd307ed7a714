"""The suite's fixtures: a private MLflow store, working directories with their own params.yaml, the
real-data folders, the reproduced CI-sized project. Helpers live in modules of their own."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.workdir import Workdir

CORES = len(os.sched_getaffinity(0))
_THREADS = pytest.StashKey[pytest.MonkeyPatch]()


# Each pytest-xdist worker and the stages it starts get their share of the cores (read by PyTorch when
# it starts, so set before any test module imports it). PyTorch's OpenMP threads spin while they
# wait: two workers training with a thread per core each run several times slower. Restored after.
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
        config.stash[_THREADS] = pytest.MonkeyPatch()
        workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        config.stash[_THREADS].setenv("OMP_NUM_THREADS", str(max(1, CORES // workers)))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _THREADS in config.stash:
        config.stash[_THREADS].undo()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: half a worker more than a worker per core, so that one test's wait on a server or a
    subprocess leaves no core idle (2-core Zen 4: 23.5 min of tests with three workers, 25.0 with
    two). PYTEST_XDIST_AUTO_NUM_WORKERS still decides where set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return CORES + CORES // 2


@pytest.fixture(scope="session", autouse=True)
def _isolated_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A private MLflow store, no network, a git identity: for the session, the environment restored
    after it."""
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
        for variable in ("DVC_NO_ANALYTICS", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            env.setenv(variable, "1")
        for variable, value in (("NAME", "test"), ("EMAIL", "test@example.com")):
            for role in ("AUTHOR", "COMMITTER"):
                env.setenv(f"GIT_{role}_{variable}", os.environ.get(f"GIT_{role}_{variable}", value))
        yield


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
def sample_build(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """sample -> ingest -> clean -> tokenizer -> pack on the default params, run once per session: read
    only (a test that runs stages takes `sample_pipeline`, its own copy)."""
    return _built(tmp_path_factory, worker_id, "sample_pipeline", None)


@pytest.fixture(scope="session")
def real_build(tmp_path_factory: pytest.TempPathFactory, worker_id: str, corpus_dir: Path) -> Path:
    """ingest -> clean -> tokenizer -> pack on the real text in CORPUS_DIR, once per session: read only."""
    return _built(tmp_path_factory, worker_id, "real_pipeline", corpus_dir)


@pytest.fixture
def sample_pipeline(sample_build: Path, tmp_path: Path) -> Workdir:
    """This test's own copy of `sample_build`, to change and run stages in: no test sees another's
    params, checkpoints or fine-tunes."""
    return Workdir.copy_of(sample_build, tmp_path / "sample_pipeline")


@pytest.fixture
def real_pipeline(real_build: Path, tmp_path: Path) -> Workdir:
    """This test's own copy of `real_build`."""
    return Workdir.copy_of(real_build, tmp_path / "real_pipeline")


def _built(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, corpus_dir: Path | None
) -> Path:
    """Data stages run once per session, shared by the pytest-xdist workers (they take a core for
    15-40 s)."""
    from tests.pipeline_helpers import prepared

    return _once_per_session(tmp_path_factory, worker_id, name, lambda f: prepared(f, corpus_dir).path)


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
