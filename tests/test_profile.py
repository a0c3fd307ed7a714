"""Profiles: the real-data profile, CI-sized, as one DVC experiment on CORPUS_DIR and GLUE_DIR; the
workspace keeps the offline default; bad input is one line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import dvc.api
import mlflow
import pytest
import yaml

from flows import profile
from flows.common import PipelineError
from tests.project import sh, tiny_project
from tests.workdir import ROOT

# the profile at CI size: one tiny encoder, one real task cut down (real RTE: test_glue_dvc.py), one
# seed (several: the evaluate and sweep tests), a small vocabulary
CI_SIZE = [
    "~models.decoder_clm",
    "~models.encdec_span",
    "++models.encoder_mlm.preset=tiny",
    "++tokenizer.vocab_size=2000",
    "++pretrain.max_steps=20",
    "++pretrain.warmup_steps=5",
    "++pretrain.val_every=10",
    "++pretrain.checkpoint_every=10",
    "++glue.tasks=[sst2]",
    "++finetune.seeds=[1]",
    "++finetune.tasks.sst2.max_train_rows=300",
    "++finetune.tasks.sst2.epochs=1",
]


# the GPU profile's settings a CPU can run, besides CI_SIZE; bf16 where this CPU has it natively (emulated
# elsewhere: 30x slower, and tested by the DDP and fine-tuning tests)
ON_THE_CPU = ["++pretrain.accelerator=cpu", "++pretrain.compile=false", "++finetune.common.accelerator=cpu"]
ON_THE_CPU += ["++pretrain.precision=auto", "++finetune.common.precision=auto"]
ON_THE_CPU += ["++pretrain.seq_len=64", "++pretrain.batch_size=16", "++pretrain.accumulate=1"]
ON_THE_CPU += ["~pretrain.max_flops", "++finetune.common.eval_batch_size=128"]


def corpus_slice(corpus_dir: Path, path: Path, chars: int = 400_000) -> Path:
    """A folder with the start of one real book of CORPUS_DIR: real text through the data stages, at CI
    size (the whole corpus, 8 MB, costs minutes of ingest, clean and tokenizer training)."""
    path.mkdir(parents=True)
    book = min(corpus_dir.glob("*.txt"), key=lambda file: file.stat().st_size)
    text = book.read_text(encoding="utf-8")[:chars]
    (path / book.name).write_text(text[: text.rfind("\n\n")], encoding="utf-8")  # whole paragraphs
    return path


def glue_folders(path: Path, *folders: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        (path / folder).mkdir(parents=True)
    return path


def test_every_profile_is_valid_params_on_any_machine(tmp_path: Path) -> None:
    assert {"real-cpu", "real-gpu"} <= set(profile.available())
    glue = glue_folders(tmp_path, "CoLA", "RTE", "WNLI")
    for name in profile.available():
        overrides = profile.overrides(name, corpus=str(ROOT), glue=str(glue))
        params = profile.validate(ROOT, overrides, f"profile {name}")
        assert not params.glue.synthetic
    assert params.glue.tasks == ["cola", "rte", "wnli"]  # real-gpu's: every task the folder has
    assert {params.models[name].preset for name in params.models} == {"bert-base", "gpt1", "t5-base"}
    assert params.pretrain.compile and params.pretrain.precision == "bf16-mixed"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_the_gpu_profile_says_in_one_line_that_it_needs_a_gpu(tmp_path: Path) -> None:
    glue = glue_folders(tmp_path / "glue", "SST-2")
    command = ["-m", "flows.profile", "real-gpu", "--corpus", str(tmp_path), "--glue", str(glue)]
    result = sh(ROOT, sys.executable, *command, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: profile real-gpu needs a GPU (pretrain.accelerator and finetune.common.accelerator = gpu) "
        "and torch sees no CUDA device here; on a CPU run the real-cpu profile"
    )
    with pytest.raises(PipelineError, match=r"profile 'real-gpu': .* has no GLUE task folder \(CoLA, SST-2"):
        profile.overrides("real-gpu", str(tmp_path), str(glue_folders(tmp_path / "empty")))


def test_profile_input_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="profile 'nope' is unknown"):
        profile.overrides("nope")
    with pytest.raises(PipelineError, match="profile 'real-cpu' reads corpus data: give --corpus"):
        profile.overrides("real-cpu", glue=str(tmp_path))
    with pytest.raises(PipelineError, match="--glue .*/missing: not a directory"):
        profile.overrides("real-cpu", corpus=str(tmp_path), glue=str(tmp_path / "missing"))
    given = [*profile.overrides("real-cpu", str(tmp_path), str(tmp_path)), "++pretrain.max_steps=0"]
    with pytest.raises(PipelineError, match=r"pretrain.max_steps=0: Input should be greater than or equal"):
        profile.validate(ROOT, given, "profile real-cpu")
    result = sh(ROOT, sys.executable, "-m", "flows.profile", "real-cpu", "--glue", str(tmp_path), check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: profile 'real-cpu' reads corpus data: give --corpus <folder>"


def test_real_profile_runs_the_graph_as_one_experiment_with_verdicts(
    tmp_path: Path, corpus_dir: Path, glue_dir: Path
) -> None:
    """The GPU profile at CI size on the CPU (the real-cpu profile runs through the same code)."""
    project = tiny_project(tmp_path / "project")
    default_params = (project / "params.yaml").read_text()
    store = f"sqlite:///{tmp_path}/mlflow.db"
    corpus = corpus_slice(corpus_dir, tmp_path / "corpus")
    command = [sys.executable, "-m", "flows.profile", "real-gpu", "--repo", str(project), "--name", "real-ci"]
    command += ["--corpus", str(corpus), "--glue", str(glue_dir)]
    for override in [*ON_THE_CPU, *CI_SIZE]:
        command += ["-S", override]
    result = sh(project, *command, MLFLOW_TRACKING_URI=store)
    assert "GLUE report:" in result.stdout and "| encoder_mlm (encoder, mlm) | pretrained |" in result.stdout

    # the workspace keeps the offline default; the experiment holds the real-data run
    assert (project / "params.yaml").read_text() == default_params
    params = yaml.safe_load(dvc.api.read("params.yaml", repo=str(project), rev="real-ci"))
    assert params["glue"]["path"] == str(glue_dir.resolve()) and params["glue"]["synthetic"] is False
    assert list(params["ingest"]["sources"]) == ["corpus"]  # the profile's source replaces the sample
    assert params["ingest"]["sources"]["corpus"]["path"] == str(corpus.resolve())
    shown = {row["Experiment"]: row for row in dvc.api.exp_show(repo=str(project)) if row["Experiment"]}
    assert shown["real-ci"]["pretrain.lr"] == 0.0005 and shown["real-ci"]["pretrain.precision"] == "auto"

    out = project / "reports/profiles/real-ci"
    report = (out / "glue.md").read_text()
    assert "Synthetic" not in report and "SST-2 Acc" in report
    glue = json.loads((out / "glue.json").read_text())["encoder_mlm"]
    for key in ("sst2", "average"):
        assert glue["verdict"][key] in ("better", "worse", "within noise")
        assert glue["delta_low"][key] <= glue["delta"][key] <= glue["delta_high"][key]
    assert "paired bootstrap over dev examples" in report and "## In short" in report
    assert shown["real-ci"]["encoder_mlm.delta_low.average"] == pytest.approx(glue["delta_low"]["average"])
    assert (out / "glue.png").read_bytes().startswith(b"\x89PNG")

    # MLflow: the stage runs of the experiment nest under the profile's run
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("lmpipe")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.stage = 'profile'")
    children = client.search_runs(
        [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    stages = {run.data.tags["stage"] for run in children}
    assert {"ingest", "clean", "tokenizer", "pack", "pretrain", "finetune", "evaluate"} <= stages
    assert all(run.data.tags.get("dvc_experiment") == "real-ci" for run in children)
    assert os.environ["MLFLOW_TRACKING_URI"] != store  # the suite's own store was left alone
