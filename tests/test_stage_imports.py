"""The stages that do not train import no torch (1.5 s and 100 MB a process): run as DVC runs them,
with Python's import log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.project import ROOT, copy_project
from tests.workdir import Workdir

TORCH = re.compile(r"\|\s+(torch|lightning)$", re.MULTILINE)


def imports_of(cwd: Path, stage: str, *args: str) -> set[str]:
    """The torch-like packages `python -m stages.<stage>` imports, as `-X importtime` logs them."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", f"stages.{stage}", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"stages.{stage}: {result.stderr[-2000:]}"
    return set(TORCH.findall(result.stderr))


@pytest.mark.parametrize(
    ("stage", "args"),
    [
        ("sample", ()),
        ("ingest", ("sample",)),
        ("clean", ()),
        ("tokenizer", ()),
        ("pack", ()),
        ("glue_prepare", ()),
        ("code", ("pretrain", "export", "finetune")),
    ],
)
def test_a_stage_that_does_not_train_imports_no_torch(
    sample_pipeline: Workdir, stage: str, args: tuple[str, ...]
) -> None:
    assert imports_of(sample_pipeline.path, stage, *args) == set()


def test_the_report_imports_no_torch(reproduced_template: Path, tmp_path: Path) -> None:
    project = copy_project(reproduced_template, tmp_path / "project")
    assert imports_of(project, "evaluate") == set()
    assert imports_of(project, "export", "encoder_mlm") == {"torch"}  # the check can see torch
