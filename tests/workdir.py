"""A temporary project directory where stages run as in the repository: its own params.yaml (set by
dotted key) beside data/, and the stage modules run in a real process."""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())


def suite_threads() -> int:
    """The training threads of the suite's projects: a pytest-xdist worker's share of the cores (set by
    conftest.py), else all of them (0). A project's params pin them (`pretrain.threads`): a stage run in
    the test's process sets that many threads for the tests after it too."""
    return int(os.environ.get("OMP_NUM_THREADS") or 0)


class Workdir:
    """A temporary project directory: params.yaml and data/, where stages run as in the repo."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.params = copy.deepcopy(DEFAULT_PARAMS)
        self.params["clean"]["workers"] = 1  # worker pools are tested on their own
        self.params["pretrain"]["threads"] = suite_threads()
        self.write_params()

    @classmethod
    def copy_of(cls, built: Path, path: Path) -> Workdir:
        """A copy of another workdir, its params and what its stages wrote, to change freely."""
        shutil.copytree(built, path, symlinks=True)
        workdir = cls.__new__(cls)
        workdir.path, workdir.params = path, yaml.safe_load((path / "params.yaml").read_text())
        return workdir

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
