"""The Prefect flows on a real, CI-sized DVC project: the pipeline flow under Prefect's test harness
(what an edit made stale runs, the rest shows as Cached, a second run does nothing, a failing stage),
one deployment of it run by a real local server and process worker, and an ablation sweep into DVC
experiments, nested MLflow runs and a comparison."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import dvc.api
import mlflow
import pandas as pd
import pytest
import yaml
from prefect.testing.utilities import prefect_test_harness

from flows import EPHEMERAL_TIMEOUT_ENV
from flows.common import PipelineError, error_line
from flows.pipeline import StageFailed, pipeline, read_graph, select
from flows.sweep import point_overrides
from lmpipe.tracking import FLOW_PROCESS_TAG, flow_process
from tests.project import TWO_KEY_SWEEP, copy_project, dvc_stages, make_project, sh
from tests.services import BIN, free_port, prefect, prefect_env, prefect_server, start, stop
from tests.workdir import ROOT


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture
def project(reproduced_template: Path, tmp_path: Path) -> Path:
    """The CI-sized project, reproduced: this test's own copy."""
    return copy_project(reproduced_template, tmp_path / "project")


def runs(filter_string: str, store: str | None = None) -> list[mlflow.entities.Run]:
    """The runs of the suite's MLflow store (or of `store`) that match `filter_string`."""
    client = mlflow.MlflowClient(store or os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("lmpipe")
    return client.search_runs([experiment.experiment_id], filter_string, max_results=1000)


def test_a_point_drops_the_own_fine_tuning_values_of_the_models_it_drops() -> None:
    """A profile's `finetune.models.encdec_span` must not break a point that trains another model."""
    from flows import profile as profiles

    on_profile = ["++finetune.models.encdec_span.lr=0.0003"]
    params = profiles.applied(ROOT, on_profile, "test")
    encoder = point_overrides({"models": "encoder_mlm"}, params, ROOT / "params.yaml")
    assert encoder == ["~models.decoder_clm", "~models.encdec_span", "~finetune.models.encdec_span"]
    assert profiles.validate(ROOT, [*on_profile, *encoder], "test").finetune.models == {}
    encdec = point_overrides({"models": "encdec_span"}, params, ROOT / "params.yaml")
    assert encdec == ["~models.encoder_mlm", "~models.decoder_clm"]
    kept = profiles.validate(ROOT, [*on_profile, *encdec], "test")
    assert kept.recipe_of("encdec_span", "sst2").lr == 3.0e-4


def test_applied_params_are_what_dvc_writes_for_the_same_overrides(tmp_path: Path) -> None:
    """`applied` runs DVC's steps in memory: on every profile, with a deletion, a mapping and a list
    set, it gives what `dvc exp run -S` writes into params.yaml, read back as a stage reads it; a bad
    override is one line."""
    from dvc.utils.hydra import apply_overrides as dvc_apply

    from flows import profile as profiles

    (tmp_path / "SST-2").mkdir()
    extra = ["~models.decoder_clm", "++objectives.mlm={mask_rate:0.2}", "finetune.seeds=[3,4]"]
    for name in ["params.yaml", *profiles.available()]:
        given = [] if name == "params.yaml" else profiles.overrides(name, str(tmp_path), str(tmp_path))
        for overrides in (given, [*given, *extra]):
            written = tmp_path / "params.yaml"
            shutil.copy(ROOT / "params.yaml", written)
            dvc_apply(str(written), overrides)
            assert profiles.applied(ROOT, overrides, name) == yaml.safe_load(written.read_text()), name
    with pytest.raises(PipelineError, match=r"^profile x: override 'pretrain\.max_steps=\[1': no viable"):
        profiles.applied(ROOT, ["pretrain.max_steps=[1"], "profile x")


def test_a_pretrain_key_a_model_sets_for_itself_is_not_swept_for_the_section() -> None:
    """On a profile whose decoder has its own step budget, a sweep of `pretrain.max_steps` would leave
    the decoder unchanged: rejected, unless the point sets the decoder's own key or leaves it out."""
    from flows import profile as profiles

    params = profiles.applied(ROOT, ["++models.decoder_clm.pretrain.max_steps=1700"], "profile real-cpu")
    with pytest.raises(PipelineError) as caught:
        point_overrides({"pretrain.max_steps": 6800}, params, ROOT / "params.yaml", "profile real-cpu")
    assert str(caught.value) == (
        "grid key 'pretrain.max_steps': profile real-cpu sets models.decoder_clm.pretrain.max_steps "
        "(1700), which wins for decoder_clm: sweep 'models.decoder_clm.pretrain.max_steps' too, or "
        "leave decoder_clm out of the point"
    )
    encoder_only = {"models": "encoder_mlm", "pretrain.max_steps": 6800}
    assert point_overrides(encoder_only, params, ROOT / "params.yaml")[-1] == "pretrain.max_steps=6800"
    both = {"pretrain.max_steps": 6800, "++models.decoder_clm.pretrain.max_steps": 3400}
    swept = point_overrides(both, params, ROOT / "params.yaml")
    assert swept[-1] == "++models.decoder_clm.pretrain.max_steps=3400"
    # a key the decoder does not set for itself reaches it
    assert point_overrides({"pretrain.lr": 3e-4}, params, ROOT / "params.yaml") == ["pretrain.lr=0.0003"]


def test_a_point_sets_a_mapping_as_given_not_merged_into_the_one_it_replaces(tmp_path: Path) -> None:
    """`-S key={...}` merges into the mapping params.yaml has: a point's mapping replaces it, so that
    the point trains what its value says (here: the decoder without the profile's own step budget)."""
    from flows import profile as profiles
    from flows.common import apply_overrides

    params = profiles.applied(ROOT, ["++models.decoder_clm.pretrain.max_steps=1700"], "profile real-cpu")
    point = {"models.decoder_clm.pretrain": {"warmup_steps": 10}, "objectives.mlm": {"mask_rate": 0.2}}
    overrides = point_overrides(point, params, ROOT / "params.yaml")
    assert overrides == [
        "~models.decoder_clm.pretrain",
        "++models.decoder_clm.pretrain={warmup_steps:10}",
        "~objectives.mlm",
        "++objectives.mlm={mask_rate:0.2}",
    ]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    apply_overrides(tmp_path, overrides)  # as `dvc exp run -S` applies them
    applied = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert applied["models"]["decoder_clm"]["pretrain"] == {"warmup_steps": 10}
    assert applied["objectives"]["mlm"] == {"mask_rate": 0.2}
    assert applied["models"]["encoder_mlm"] == params["models"]["encoder_mlm"]  # nothing else moved


def test_a_point_may_set_a_key_that_only_its_profile_has(tmp_path: Path) -> None:
    """The key the shadowing message names exists on the profile, not in params.yaml: accepted as the
    message says to write it, before any flow starts; a misspelt one is still one line naming the profile."""
    from flows.ablation import check

    (tmp_path / "SST-2").mkdir()
    decoder = {"models": "decoder_clm", "models.decoder_clm.pretrain.max_steps": 6800}
    arguments = {
        "repo": str(ROOT),
        "preset": None,
        "baseline": None,
        "profile": "real-cpu",
        "set_params": None,
        "rows": None,
    }
    arguments |= {"corpus": str(tmp_path), "glue": str(tmp_path), "grid": [decoder]}
    check(arguments)

    def refusal(point: dict[str, object]) -> str:
        with pytest.raises(PipelineError) as caught:
            check(arguments | {"grid": [point]})
        return str(caught.value)

    misspelt = {"models": "decoder_clm", "models.decoder_clm.pretrain.max_step": 6800}
    assert refusal(misspelt) == (
        "params override 'models.decoder_clm.pretrain.max_step=6800': profile real-cpu has no key "
        "'models.decoder_clm.pretrain.max_step'"
    )
    with pytest.raises(PipelineError, match="params.yaml has no key 'models.decoder_clm.pretrain.max_steps'"):
        check(arguments | {"profile": None})  # the offline default sets no per-model budget
    dropped = {"models": "encoder_mlm", "models.decoder_clm.pretrain.max_steps": 6800}
    assert refusal(dropped) == (
        "grid key 'models.decoder_clm.pretrain.max_steps': the point does not train decoder_clm "
        "(models: ['encoder_mlm'])"
    )


def test_a_point_that_adds_a_key_logs_it_to_mlflow_by_its_params_key(tmp_path: Path) -> None:
    """`++key` adds a key params.yaml lacks (span_density's rows widen max_len so): the point's MLflow
    params and tags name the key without the `++`, which MLflow refuses in a name."""
    from flows.sweep import point_params
    from lmpipe.tracking import FlowTracking

    point = {
        "models": ["encdec_span"],
        "objectives.span.noise_density": 0.5,
        "++models.encdec_span.max_len": 182,
    }
    assert point_params(point) == {
        "models": "encdec_span",
        "objectives.span.noise_density": "0.5",
        "models.encdec_span.max_len": "182",
    }
    tracking = FlowTracking(tmp_path, "grid")
    run = tracking.start("grid-1", {f"param.{key}": value for key, value in point_params(point).items()})
    tracking.log(run, {"duration_s": 1.0}, point_params(point))
    logged = tracking.client.get_run(run).data
    assert logged.params["models.encdec_span.max_len"] == "182"
    assert logged.tags["param.models.encdec_span.max_len"] == "182"


def test_a_point_may_define_its_own_models_from_those_of_its_params(tmp_path: Path) -> None:
    """`models: {name: {"from": <model>, ...}}`: the point trains these alone, each the named model's
    fields (its size on the profile) with the given ones changed, with that model's fine-tuning values."""
    from flows import profile as profiles
    from flows.common import apply_overrides

    (tmp_path / "SST-2").mkdir()
    params = profiles.applied(ROOT, profiles.overrides("real-cpu", str(tmp_path), str(tmp_path)), "real-cpu")
    point = {"models": {"prefix_span": {"from": "encdec_span", "arch": "prefix_lm", "max_len": 256}}}
    overrides = point_overrides(point, params, ROOT / "params.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    apply_overrides(tmp_path, overrides)
    applied = yaml.safe_load((tmp_path / "params.yaml").read_text())
    own = {**params["models"]["encdec_span"], "arch": "prefix_lm", "max_len": 256}
    assert applied["models"] == {"prefix_span": own}
    assert own["preset"] == "small" and own["pretrain"] == {"max_steps": 3300}  # the profile's
    assert applied["finetune"]["models"] == {"prefix_span": {"lr": 3.0e-4}}
    refused = {"models": {"t5": {"arch": "prefix_lm"}}}
    with pytest.raises(
        PipelineError, match=r"^grid key 'models.t5': give \{\"from\": <a model of params.yaml>"
    ):
        point_overrides(refused, params, ROOT / "params.yaml")


def test_a_fine_tuning_sweep_compares_each_init_at_its_best_point() -> None:
    """Two fine-tuning rates: the first suits scratch (80 % against 70 %), the second the pretrained init
    (90 % against 60 %); each init's best point, paired over the same 100 SST-2 dev examples."""
    from flows.ablation import best_of_each_init, best_of_each_init_lines
    from flows.sweep import Point

    labels = [0, 1] * 51  # the last test scores one point on examples 1-100

    def predictions(correct: dict[str, int], idx: range = range(100)) -> pd.DataFrame:
        """Each init right on its first `correct[init]` examples, the same for its three seeds."""
        rows = [
            {
                "model": "encoder_mlm",
                "init": init,
                "evaluation": "sst2",
                "seed": seed,
                "idx": i,
                "label": labels[i],
                "prediction": labels[i] if i < right else 1 - labels[i],
            }
            for init, right in correct.items()
            for seed in (1, 2, 3)
            for i in idx
        ]
        return pd.DataFrame(rows)

    def result(pretrained: int, scratch: int, idx: range = range(100)) -> dict:
        glue = {"encoder_mlm": {"pretrained": {"average": pretrained}, "scratch": {"average": scratch}}}
        return {"glue": glue, "predictions": predictions({"pretrained": pretrained, "scratch": scratch}, idx)}

    points = [
        Point(i, f"lr-{i + 1}", {"finetune.tasks.sst2.lr": lr}, [], f"run{i}")
        for i, lr in enumerate([1e-4, 3e-4])
    ]
    best = best_of_each_init(points, {0: result(70, 80), 1: result(90, 60)}, seed=0)
    [row] = best.to_dict("records")
    assert (row["pretrained_experiment"], row["scratch_experiment"]) == ("lr-2", "lr-1")
    assert row["delta"] == pytest.approx(10.0)  # 90 % against 80 %: ten examples only the first gets right
    assert row["delta_low"] > 0 and row["delta_verdict"] == "better"
    [header, _, line] = best_of_each_init_lines(best)
    assert header == "| model | pretrained: best point | scratch: best point | Δ pretrained − scratch |"
    assert line.startswith("| encoder_mlm | `lr-2`: 90.00 | `lr-1`: 80.00 | +10.00 [") and line.endswith(
        "**better** |"
    )

    # picks scored on other dev examples are not paired
    apart = best_of_each_init(points, {0: result(70, 80, range(1, 101)), 1: result(90, 60)}, seed=0)
    assert apart["delta_verdict"].tolist() == ["not comparable (other dev examples)"]


def test_the_sweep_plot_shows_each_points_delta_over_scratch_with_its_interval() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flows.ablation import _plot_delta_over_scratch

    table = pd.DataFrame(
        {
            "model": ["decoder_clm"] * 3,
            "pretrain.max_steps": [1700, 3400, 6800],
            "delta_average": [0.1, 1.6, 3.5],
            "delta_average_low": [-1.8, -0.2, 1.0],
            "delta_average_high": [2.3, 4.0, 6.1],
            "delta_average_verdict": ["within noise", "within noise", "better"],
        }
    )
    fig, ax = plt.subplots()
    _plot_delta_over_scratch(ax, table, lambda frame: frame["pretrain.max_steps"])
    [bars] = ax.containers
    assert list(bars.lines[0].get_ydata()) == [0.1, 1.6, 3.5]
    [segments] = bars.lines[2]  # the vertical error bars: from each interval's low to its high
    ends = [float(y) for segment in segments.get_segments() for y in segment[:, 1]]
    assert ends == pytest.approx([-1.8, 2.3, -0.2, 4.0, 1.0, 6.1])
    filled = [line for line in ax.lines if line.get_marker() == "o" and line.get_markerfacecolor() != "white"]
    hollow = [line for line in ax.lines if line.get_marker() == "o" and line.get_markerfacecolor() == "white"]
    assert [list(line.get_xdata()) for line in filled] == [[6800]]  # only the `better` point
    assert [list(line.get_xdata()) for line in hollow] == [[1700, 3400]]
    plt.close(fig)


# the tests that need the reproduced project come after those that need nothing: while another
# pytest-xdist worker builds it, this one has work
def test_graph_is_dvcs_own(project: Path) -> None:
    nodes = read_graph(project)
    assert set(nodes) == dvc_stages(project)  # what `dvc stage list` lists, foreach expanded
    assert set(nodes["evaluate"].upstream) == {"glue_prepare", "finetune@encoder_mlm"}
    assert nodes["pretrain@encoder_mlm"].gpu and nodes["pretrain@encoder_mlm"].retries == 2
    assert not nodes["clean"].gpu and nodes["clean"].retries == 0
    assert set(select(nodes, ["pack"])) == {"sample", "ingest@sample", "clean", "tokenizer", "pack"}
    assert "pretrain@encoder_mlm" in select(nodes, ["pretrain"])  # a foreach group by its name
    with pytest.raises(PipelineError, match="target 'pretrian' is not a stage"):
        select(nodes, ["pretrian"])


def test_pipeline_runs_what_changed_then_nothing(harness: None, project: Path, tmp_path: Path) -> None:
    sh(project, "dvc", "remote", "add", "shared", str(tmp_path / "remote"))  # as workers share a cache
    # tiny stages are mostly process start-up: two at once pay off here (not with the default profile)
    changed = ["pretrain.lr=0.0017"]  # pretraining and what reads it; not the data
    options = {"repo": str(project), "overrides": changed, "retry_delay_s": 0, "max_parallel": 2}
    state = pipeline(**options, dvc_remote="shared", return_state=True)
    first = state.result()
    stages = dvc_stages(project)
    ran = ["pretrain@encoder_mlm", "export@encoder_mlm", "finetune@encoder_mlm", "evaluate"]
    assert sorted(first["ran"]) == sorted(ran) and not first["failed"]
    assert set(first["skipped"]) == stages - set(ran)
    assert first["ran"][0] == "pretrain@encoder_mlm" and first["ran"][-1] == "evaluate"
    assert "up to date" in sh(project, "dvc", "status").stdout  # dvc.lock says what `dvc repro` would
    pushed = sh(project, "dvc", "status", "--cloud", "--remote", "shared", *ran).stdout
    assert "in sync" in pushed  # what ran is on the workers' shared remote
    # the server's view (Prefect's UI): every stage a task run, an up-to-date one in the Cached state
    states = task_run_states(state.state_details.flow_run_id, stages)
    assert states == {name: "Completed" if name in ran else "Cached" for name in stages}

    # the flow's run, the stage runs under it
    (parent,) = runs("tags.stage = 'pipeline' and tags.`override.pretrain.lr` = '0.0017'")
    assert parent.info.status == "FINISHED"
    children = runs(f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert {run.data.tags["stage"] for run in children} == {"pretrain", "export", "finetune", "evaluate"}

    state = pipeline(**options, return_state=True)
    second = state.result()
    assert second["ran"] == [] and set(second["skipped"]) == stages
    assert task_run_states(state.state_details.flow_run_id, stages) == dict.fromkeys(stages, "Cached")


def task_run_states(flow_run_id: UUID, names: set[str]) -> dict[str, str]:
    """Task run name -> its state's name, as the Prefect server has them for a flow run, once it has
    every one of `names` in a final state: the client reports task runs as events, which the server
    writes a moment after the flow returns."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 60
    of_the_flow = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=of_the_flow)
            states = {run.name: run.state.name for run in runs if run.state is not None}
            final = {run.name for run in runs if run.state is not None and run.state.is_final()}
            if names <= final or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


def test_failing_stage_stops_its_downstream_only(harness: None, project: Path) -> None:
    state = pipeline(
        repo=str(project),
        overrides=["tokenizer.vocab_size=100"],
        retry_delay_s=0,
        max_parallel=2,
        return_state=True,
    )
    assert state.is_failed()
    error = state.result(raise_on_failure=False)
    assert isinstance(error, StageFailed)
    summary = error.summary
    assert list(summary.failed) == ["tokenizer"]
    states = task_run_states(state.state_details.flow_run_id, {*summary.not_run, "tokenizer"})
    assert {name: states[name] for name in summary.not_run} == dict.fromkeys(summary.not_run, "NotRun")
    assert states["tokenizer"] == "Failed"
    assert "tokenizer.vocab_size" in summary.failed["tokenizer"]  # the stage's own one-line error
    assert set(summary.not_run) == {
        "pack",
        "pretrain@encoder_mlm",
        "export@encoder_mlm",
        "finetune@encoder_mlm",
        "evaluate",
    }
    assert set(summary.skipped) == {"sample", "ingest@sample", "clean", "glue_prepare", "code"}


def test_bad_flow_input_is_one_line(project: Path) -> None:
    bad_key = sh(
        project, sys.executable, "-m", "flows.pipeline", "-S", "tokenizer.vocab_sise=2000", check=False
    )
    assert bad_key.returncode == 2
    assert bad_key.stderr.strip() == (
        f"error: params override 'tokenizer.vocab_sise=2000': {project}/params.yaml has no key "
        "'tokenizer.vocab_sise'"
    )
    bad_model = sh(
        project, sys.executable, "-m", "flows.ablation", "--grid", '{"models": ["gpt9"]}', check=False
    )
    assert bad_model.returncode == 2
    assert bad_model.stderr.strip().startswith("error: grid key 'models': ") and "'gpt9'" in bad_model.stderr


def test_a_directory_the_commits_lock_names_and_the_cache_lacks_is_named_with_the_way_out(
    tmp_path: Path,
) -> None:
    """DVC (3.67) stops an experiment that restores every stage from the run cache when the commit's
    dvc.lock names a directory the cache lacks and a stage depends on a path inside it: a clone of a
    repository whose dvc.lock was committed elsewhere, resuming a profile. The line says why and what
    to do, not only DVC's "failed to load directory"."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_a = "import yaml; open('folder/a', 'w').write(str(yaml.safe_load(open('params.yaml'))['a']))"
    stages = {
        "copy": {"cmd": "cp source.txt copied", "deps": ["source.txt"], "outs": ["copied"]},
        "folder": {
            "cmd": f'mkdir -p folder && "{sys.executable}" -c "{write_a}"',
            "deps": ["copied"],
            "params": ["a"],
            "outs": ["folder"],
        },
        "inside": {"cmd": "cp folder/a inside", "deps": ["folder/a"], "outs": ["inside"]},
    }
    (repo / "params.yaml").write_text("a: 1\n")
    (repo / "source.txt").write_text("text\n")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for args in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"]):
        sh(repo, *args)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "the lock's outputs are in this cache only")
    shutil.rmtree(repo / ".dvc" / "cache")
    sh(repo, "dvc", "exp", "run", "--temp", "--name", "first", "-S", "a=2")  # its stages run
    again = sh(repo, "dvc", "exp", "run", "--temp", "--name", "again", "-S", "a=2", check=False)  # run cache
    assert again.returncode != 0
    line = error_line(again.stderr)
    assert line.startswith("ERROR: failed to reproduce 'inside': failed to load directory ('folder',)")
    assert line.endswith(
        "(folder as the commit's dvc.lock records it is not in the DVC cache, and DVC cannot restore a stage"
        " from the run cache past it: `dvc pull` it, or `dvc repro` and commit dvc.lock)"
    )


def test_a_temporary_server_that_does_not_start_is_one_line(tmp_path: Path) -> None:
    """No PREFECT_API_URL: the flow starts Prefect's temporary server; one that does not answer in time
    (no time at all here) is one line and exit 1, before any stage runs."""
    project = make_project(tmp_path / "project")
    waited = {EPHEMERAL_TIMEOUT_ENV: "0", "PREFECT_HOME": str(tmp_path / "home")}
    result = sh(project, sys.executable, "-m", "flows.pipeline", check=False, PREFECT_API_URL=None, **waited)
    assert result.returncode == 1, result.stderr
    # besides Prefect's own log lines (the server starting and stopping)
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: Prefect's temporary server did not answer within 0 s "
        "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS): allow it longer, or run `prefect server start` "
        "and set PREFECT_API_URL"
    ]
    assert "Traceback" not in result.stderr and not (project / "dvc.lock").exists()


def test_deployment_runs_on_a_local_server_and_process_worker(project: Path, tmp_path: Path) -> None:
    env = prefect_env(tmp_path / "prefect", free_port(), PYTHONPATH=str(ROOT))
    server = prefect_server(env, tmp_path / "server.log")
    worker = None
    try:
        prefect(env, "work-pool", "create", "cpu", "--type", "process")
        prefect(env, "--no-prompt", "deploy", "--name", "pipeline-cpu", cwd=ROOT)
        started = prefect(
            env,
            "deployment",
            "run",
            "pipeline/pipeline-cpu",
            "--param",
            f"repo={project}",
            "--param",
            "retry_delay_s=0",
        )
        flow_run_id = next(line.split()[-1] for line in started.splitlines() if "UUID" in line)
        worker_log = tmp_path / "worker.log"
        worker = start([str(BIN / "prefect"), "worker", "start", "--pool", "cpu"], worker_log, env, cwd=ROOT)
        deadline = time.monotonic() + 300
        while True:  # the server's REST API: a `prefect flow-run inspect` costs seconds of imports a call
            url = f"{env['PREFECT_API_URL']}/flow_runs/{flow_run_id}"
            with urllib.request.urlopen(url, timeout=30) as response:
                state = json.load(response)["state"]
            if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            assert time.monotonic() < deadline, worker_log.read_text()[-3000:]
            time.sleep(2)
        assert state["type"] == "COMPLETED", worker_log.read_text()[-3000:]
        # the summary, from the worker
        assert f"{len(dvc_stages(project))} up to date" in worker_log.read_text()
    finally:
        stop(*[process for process in (worker, server) if process is not None])
    assert worker.poll() is not None and server.poll() is not None


def test_a_sweep_of_two_keys(swept_template: Path) -> None:
    """TWO_KEY_SWEEP, two points as a list (a grid's product is test_expand's), run by the command line:
    two pretrains, exports, fine-tunes and evaluations; the scratch baselines stay cached."""
    project = swept_template
    table = pd.read_csv(project / "reports/ablation/grid/comparison.csv")
    assert len(table) == 2 and list(table["experiment"]) == ["grid-1", "grid-2"]
    assert list(table["objectives.mlm.mask_rate"]) == [0.1, 0.3]
    assert list(table["pretrain.lr"]) == [0.001, 0.002]
    assert table["stsb"].abs().sum() > 0  # real scores, not a table of zeros
    # every point's spread and its verdict against the baseline (the first point of a custom grid)
    assert list(table["vs_baseline_verdict"])[0] == "baseline"
    assert set(table["vs_baseline_verdict"][1:]) <= {"better", "worse", "within noise"}
    assert (table["vs_baseline_low"][1:] <= table["vs_baseline"][1:]).all()
    assert set(table["delta_average_verdict"]) <= {"better", "worse", "within noise"}
    assert {"glue_average_std", "stsb_std", "stsb_vs_baseline_verdict"} <= set(table.columns)
    report = (project / "reports/ablation/grid/comparison.md").read_text()
    assert "Δ vs baseline" in report and "| parameters |" in report and "| scratch average |" in report
    # the scratch baseline's level beside Δ: one cached stage for both points, so one value
    assert table["scratch_average"].nunique() == 1 and table["scratch_average_std"].nunique() == 1
    # FLOPs per point: at the same steps, masking 30 % runs the LM head on more positions than 10 %
    assert len(set(table["pretrain_steps"])) == 1
    assert len(set(table["parameters"])) == 1 and table["parameters"].min() > 0  # one model, two objectives
    assert (table["train_flops"][table["objectives.mlm.mask_rate"] == 0.3] > table["train_flops"].min()).all()
    for name in ("comparison.md", "glue.png", "pretrain_loss.png"):
        assert (project / "reports/ablation/grid" / name).stat().st_size > 0

    # a DVC experiment per point with its params and GLUE metrics
    shown = {row["Experiment"]: row for row in dvc.api.exp_show(repo=str(project)) if row["Experiment"]}
    assert set(shown) >= {"grid-1", "grid-2"}
    for row in table.to_dict("records"):
        exp = shown[row["experiment"]]
        assert exp["objectives.mlm.mask_rate"] == row["objectives.mlm.mask_rate"]
        assert exp["pretrain.lr"] == row["pretrain.lr"]
        assert exp["encoder_mlm.pretrained.average"] == pytest.approx(row["glue_average"], abs=1e-4)

    # MLflow: one parent, one child per point tagged with its values, the point's stage runs under it
    store = f"sqlite:///{project / 'mlflow.db'}"
    [parent] = [run.info.run_id for run in runs("tags.sweep = 'grid' and tags.stage = 'ablation'", store)]
    points = runs(f"tags.`mlflow.parentRunId` = '{parent}'", store)
    assert len(points) == 2 and {p.data.tags["dvc_experiment"] for p in points} == set(table["experiment"])
    client = mlflow.MlflowClient(store)
    assert {a.path for a in client.list_artifacts(parent)} >= {"comparison.csv", "comparison.md", "glue.png"}
    for point in points:
        row = table[table["experiment"] == point.data.tags["dvc_experiment"]].iloc[0]
        assert float(point.data.tags["param.objectives.mlm.mask_rate"]) == row["objectives.mlm.mask_rate"]
        assert float(point.data.tags["param.pretrain.lr"]) == row["pretrain.lr"]
        assert point.data.metrics["glue.encoder_mlm.pretrained.average"] == pytest.approx(row["glue_average"])
        assert point.data.metrics["glue.encoder_mlm.pretrained.stsb"] == pytest.approx(row["stsb"])
        stages = runs(f"tags.`mlflow.parentRunId` = '{point.info.run_id}'", store)
        by_stage = {run.data.tags["stage"]: run for run in stages}
        # a pretraining ablation re-runs pretrain, export, finetune and evaluate, never the scratch baseline
        assert set(by_stage) == {"pretrain", "export", "finetune", "evaluate"}
        assert {run.data.tags.get("init") for run in stages if run.data.tags["stage"] == "finetune"} == {
            "pretrained"
        }
        assert all(run.data.tags["dvc_experiment"] == point.data.tags["dvc_experiment"] for run in stages)
        evaluated = by_stage["evaluate"].data.metrics["encoder_mlm.pretrained.average"]
        assert evaluated == pytest.approx(row["glue_average"])  # the table is what the stage logged
        scratch = by_stage["evaluate"].data.metrics["encoder_mlm.scratch.average"]
        assert scratch == pytest.approx(row["scratch_average"])


def test_a_task_average_reads_a_sweep_point_by_its_experiment_name(swept_template: Path) -> None:
    """docs/results/task_average.py on a `--temp` sweep point: its predictions from the DVC cache
    through the experiment's commit; over all its tasks, the Δ vs scratch, interval and verdict that
    the point's evaluate stage wrote; a task the run lacks is one line."""

    def task_average(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "docs.results.task_average", *args, "--repo", str(swept_template)]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)

    table = pd.read_csv(swept_template / "reports/ablation/grid/comparison.csv")
    row = table[table["experiment"] == "grid-2"].iloc[0]
    tasks = sorted(column.removesuffix("_vs_baseline") for column in table if column.endswith("_vs_baseline"))
    result = task_average("grid-2", "--model", "encoder_mlm", "--tasks", ",".join(tasks))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(line.split()[0] for line in lines[:-1]) == tasks
    interval = f"[{row['delta_average_low']:+.2f}, {row['delta_average_high']:+.2f}]"
    expected = f"{row['delta_average']:+6.2f} {interval} {row['delta_average_verdict']}, detectable"
    assert lines[-1].startswith(f"{'average':8s} {expected}")
    result = task_average("grid-2", "--model", "encoder_mlm", "--tasks", "rte")
    assert (result.returncode, result.stderr) == (
        2,
        f"error: --tasks: the run has no rte (it has {', '.join(tasks)})\n",
    )


def test_a_sweep_run_again_by_its_name_goes_on_from_the_run_cache(
    swept_template: Path, tmp_path: Path
) -> None:
    """The sweep `grid` run again under its name, as after an interruption: the points the first run
    finished (DVC refuses an experiment name HEAD already has) come back from the run cache, the
    comparison is the first run's, and the MLflow runs a stopped run left running are marked KILLED; so
    are another sweep's whose process has gone (a pid now another process's), not a living one's."""
    project = copy_project(swept_template, tmp_path / "project")
    first = pd.read_csv(project / "reports/ablation/grid/comparison.csv")
    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiments = [found.experiment_id for found in client.search_experiments()]
    (experiment,) = {run.info.experiment_id for run in client.search_runs(experiments, "tags.sweep = 'grid'")}
    stopped = client.create_run(experiment, run_name="grid", tags={"sweep": "grid", "stage": "ablation"})
    stopped_point = client.create_run(
        experiment, run_name="grid-1", tags={"sweep": "grid", "mlflow.parentRunId": stopped.info.run_id}
    )
    owners = {"gone": f"{socket.gethostname()}:{os.getpid()}:0.00", "living": flow_process()}
    others = {
        name: client.create_run(experiment, run_name=name, tags={"sweep": name, FLOW_PROCESS_TAG: owner})
        for name, owner in owners.items()
    }
    gone_tags = {"sweep": "gone", "mlflow.parentRunId": others["gone"].info.run_id}
    gone_point = client.create_run(experiment, run_name="gone-1", tags=gone_tags)
    again = sh(
        project,
        *[sys.executable, "-m", "flows.ablation", "--grid", json.dumps(TWO_KEY_SWEEP), "--name", "grid"],
        MLFLOW_TRACKING_URI=None,
        PREFECT_API_URL=None,
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    log = again.stdout + again.stderr
    assert "grid-1: finished by an earlier run" in log and "grid-2: finished by an earlier run" in log
    assert log.count("ran nothing (all cached)") == 2
    table = pd.read_csv(project / "reports/ablation/grid/comparison.csv")
    columns = ["experiment", "glue_average", "stsb", "delta_average", "vs_baseline_verdict"]
    pd.testing.assert_frame_equal(table[columns], first[columns])
    assert "grid: 2 runs of an earlier, stopped run of it marked KILLED" in log
    assert "2 runs of flows whose process has gone marked KILLED" in log
    status = {name: client.get_run(run.info.run_id).info.status for name, run in others.items()}
    assert status == {"gone": "KILLED", "living": "RUNNING"}
    assert client.get_run(gone_point.info.run_id).info.status == "KILLED"
    runs = client.search_runs([experiment], "tags.sweep = 'grid'")
    statuses = {run.info.run_id: run.info.status for run in runs}
    assert statuses.pop(stopped.info.run_id) == statuses.pop(stopped_point.info.run_id) == "KILLED"
    assert set(statuses.values()) == {"FINISHED"} and len(statuses) == 6  # two parents of 3 runs each


def test_a_crashed_stages_error_line_says_what_it_raised() -> None:
    """A stage that crashes prints no `error:` line: the point's failure names what it raised (UL2's
    129-token batch said only `exited with 1`)."""
    crashed = (
        "Traceback (most recent call last):\n"
        '  File "models/transformer.py", line 372, in embeddings\n'
        "ValueError: sequence of 129 tokens exceeds max_len=128\n"
        "ERROR: failed to reproduce 'pretrain@ul2': failed to run: python -m stages.pretrain ul2, "
        "exited with 1\n"
    )
    assert error_line(crashed) == (
        "ERROR: failed to reproduce 'pretrain@ul2': failed to run: python -m stages.pretrain ul2, exited "
        "with 1 (ValueError: sequence of 129 tokens exceeds max_len=128)"
    )
    said = "error: params.yaml: pretrain.lr: must be > 0\nERROR: failed to reproduce 'pretrain@m'\n"
    assert error_line(said) == "error: params.yaml: pretrain.lr: must be > 0"
