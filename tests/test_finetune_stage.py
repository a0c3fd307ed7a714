"""Stage `finetune@<model>` on the synthetic sample: predictions and summaries of the pretrained model
and its scratch baseline, MLflow runs linked to the pretraining run, determinism (in any number of
worker processes), the finished jobs kept by digest, bad input."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmpipe.layout import FINETUNE_CACHE, INITS, predictions_sha256
from lmpipe.runtime import StageError, sha256_file
from models.training import resolve_precision
from tests.pipeline_helpers import run_stages
from tests.workdir import DEFAULT_PARAMS, Workdir

DEV_ROWS = DEFAULT_PARAMS["sample"]["glue_dev_rows"]
MODEL = {"arch": "encoder", "objective": "mlm", "preset": "tiny"}
OVERRIDES = {
    "models": {"enc": MODEL},
    "glue.tasks": ["stsb"],
    "finetune.seeds": [1, 2],
    "finetune.tasks.stsb.max_train_rows": 64,
    "finetune.tasks.stsb.epochs": 1,
    "pretrain.max_steps": 10,
    "pretrain.warmup_steps": 0,
    "pretrain.val_every": 10,
    "pretrain.checkpoint_every": 10,
    "pretrain.precision": "auto",
    "finetune.common.precision": "auto",
}


def finetune(workdir: Workdir, *args: str) -> None:
    from stages import finetune as stage

    with contextlib.chdir(workdir.path):
        stage.main(list(args))


@pytest.fixture(scope="module")
def tuned(sample_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workdir]:
    """enc pretrained for 10 steps, then fine-tuned on the synthetic STS-B from it and from scratch: the
    module's own copy of the sample project, its params restored after each test that changes them."""
    from stages import glue_prepare

    workdir = Workdir.copy_of(sample_build, tmp_path_factory.mktemp("tuned") / "workdir")
    with workdir.changed(OVERRIDES):
        with contextlib.chdir(workdir.path):
            glue_prepare.main()
        run_stages(workdir, "pretrain", "enc")
        finetune(workdir, "enc")
        yield workdir


def out(workdir: Workdir, init: str) -> Path:
    return workdir.path / "data/finetune/enc" / init / "stsb"


def test_predictions_and_summary_of_both_inits(tuned: Workdir) -> None:
    weights = sha256_file(tuned.path / "checkpoints/enc/final/model.safetensors")
    frames = {}
    for init in ["pretrained", "scratch"]:
        summary = json.loads((out(tuned, init) / "summary.json").read_text())
        assert summary["train_rows"] == 64 and summary["steps"] == 2 and summary["synthetic"] is True
        assert summary["eval_rows"] == {"validation": DEV_ROWS}
        assert set(summary["seeds"]) == {"1", "2"}
        assert summary["weights_sha256"] == (weights if init == "pretrained" else None)
        for seed in [1, 2]:
            frame = pd.read_parquet(out(tuned, init) / f"seed{seed}/validation.parquet")
            assert list(frame.columns) == ["idx", "label", "prediction"] and len(frame) == DEV_ROWS
            assert frame["idx"].tolist() == list(range(DEV_ROWS)) and frame["prediction"].dtype == "float32"
            frames[(init, seed)] = frame["prediction"]
    assert not frames[("pretrained", 1)].equals(frames[("scratch", 1)])
    assert not frames[("pretrained", 1)].equals(frames[("pretrained", 2)])


def test_one_mlflow_run_per_seed_linked_to_the_pretraining_run(tuned: Workdir) -> None:
    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("lmpipe")
    weights = sha256_file(tuned.path / "checkpoints/enc/final/model.safetensors")
    (pretraining,) = client.search_runs(
        [experiment.experiment_id], f"tags.stage = 'pretrain' and tags.weights_sha256 = '{weights}'"
    )
    assert pretraining.data.tags["model"] == "enc"
    # `auto` is logged as the precision it resolved to on this CPU (its branches: tests/test_finetune.py)
    resolved = resolve_precision("auto", torch.device("cpu"))
    assert pretraining.data.params["pretrain.precision"] == resolved
    for init in ["pretrained", "scratch"]:
        summary = json.loads((out(tuned, init) / "summary.json").read_text())
        for seed, entry in summary["seeds"].items():
            digest = entry["predictions_sha256"]
            assert digest == predictions_sha256(out(tuned, init) / f"seed{seed}")
            (run,) = client.search_runs(
                [experiment.experiment_id],
                f"tags.predictions_sha256 = '{digest}' and tags.init = '{init}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            tags = run.data.tags
            assert run.info.status == "FINISHED" and run.info.experiment_id == experiment.experiment_id
            assert tags["stage"] == "finetune" and tags["mlflow.runName"] == (
                f"finetune@enc/stsb/{init}/seed{seed}"
            )
            assert (
                tags["model"],
                tags["arch"],
                tags["objective"],
                tags["task"],
                tags["init"],
                tags["seed"],
            ) == (
                "enc",
                "encoder",
                "mlm",
                "stsb",
                init,
                seed,
            )
            assert tags.get("pretrain_run_id") == (pretraining.info.run_id if init == "pretrained" else None)
            assert tags["data.synthetic"] == "True"
            assert run.data.params["finetune.tasks.stsb.max_train_rows"] == "64"
            assert run.data.params["finetune.common.precision"] == resolved
            assert run.data.metrics["loss.validation"] == pytest.approx(entry["eval_loss"]["validation"])
            curve = client.get_metric_history(run.info.run_id, "train_loss")
            assert [m.step for m in sorted(curve, key=lambda m: m.step)] == [0, 1]


def test_same_params_same_predictions_in_any_number_of_processes(
    tuned: Workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Computed again (the finished jobs removed), in this process and in two worker processes: the
    same bytes, as the first time."""

    stage_out = tuned.path / "data/finetune/enc"

    def predictions() -> dict[str, pd.DataFrame]:
        files = sorted(stage_out.glob("*/stsb/seed*/*.parquet"))
        return {str(p.relative_to(stage_out)): pd.read_parquet(p) for p in files}

    def summaries() -> list[bytes]:
        return [(out(tuned, init) / "summary.json").read_bytes() for init in ("pretrained", "scratch")]

    before, summary = predictions(), summaries()
    assert [name.split("/")[0] for name in before] == ["pretrained", "pretrained", "scratch", "scratch"]
    for share in ["1", "2"]:  # the cores the stage may use: one job at a time, or two at once
        shutil.rmtree(tuned.path / FINETUNE_CACHE)
        monkeypatch.setenv("OMP_NUM_THREADS", share)
        with tuned.changed(OVERRIDES):
            finetune(tuned, "enc")
        assert summaries() == summary  # no run ids, no timings
        after = predictions()
        assert list(after) == list(before)
        for name in before:
            pd.testing.assert_frame_equal(before[name], after[name])


def test_finished_jobs_are_kept_by_digest(tuned: Workdir, caplog: pytest.LogCaptureFixture) -> None:
    """A seed added fine-tunes only that seed; the same params again fine-tune nothing."""
    before = json.loads((out(tuned, "scratch") / "summary.json").read_text())
    caplog.set_level("INFO", logger="lmpipe")
    try:
        with tuned.changed({**OVERRIDES, "finetune.seeds": [1, 2, 3]}):
            finetune(tuned, "enc")
            assert (
                "6 fine-tunes (1 tasks x 3 seeds, pretrained and from scratch), 4 done before" in caplog.text
            )
            assert "finetune@enc stsb scratch seed 3:" in caplog.text
            assert "seed 1:" not in caplog.text
            after = json.loads((out(tuned, "scratch") / "summary.json").read_text())
            assert set(after["seeds"]) == {"1", "2", "3"}
            assert {s: after["seeds"][s] for s in ("1", "2")} == before["seeds"]
    finally:
        with tuned.changed(OVERRIDES):
            caplog.clear()
            finetune(tuned, "enc")
            assert (
                "4 fine-tunes (1 tasks x 2 seeds, pretrained and from scratch), 4 done before" in caplog.text
            )
    assert json.loads((out(tuned, "scratch") / "summary.json").read_text()) == before


def test_evaluate_reports_the_synthetic_run(tuned: Workdir) -> None:
    from stages import evaluate

    with tuned.changed(OVERRIDES), contextlib.chdir(tuned.path):
        evaluate.main()
    glue = json.loads((tuned.path / "metrics/glue.json").read_text())
    assert set(glue["enc"]) == {
        *("pretrained", "scratch", "pretrained_mean", "pretrained_std", "scratch_mean", "scratch_std"),
        *("delta", "delta_low", "delta_high", "verdict", "delta_detectable", "weights"),
    }
    assert glue["enc"]["weights"]["trained"] == glue["enc"]["weights"]["total"]  # full fine-tuning
    assert glue["enc"]["verdict"]["stsb"] in ("better", "worse", "within noise")
    assert glue["enc"]["delta_detectable"]["average"] > 0
    assert set(glue["enc"]["pretrained"]) == {"stsb", "average"}
    report = (tuned.path / "reports/glue.md").read_text()
    assert "**Synthetic data.**" in report and "| enc (encoder, mlm) | pretrained |" in report


def test_a_lora_fine_tune_trains_its_adapters_on_both_inits_and_the_report_says_what(tuned: Workdir) -> None:
    """finetune.method lora: the counts in the summaries and MLflow, predictions unlike full
    fine-tuning's, and the report's line on what the frozen scratch baseline is."""
    import mlflow

    from stages import evaluate

    lora = {**OVERRIDES, "finetune.method": "lora", "finetune.methods.lora.rank": 4}
    full = {init: pd.read_parquet(out(tuned, init) / "seed1/validation.parquet") for init in INITS}
    try:
        with tuned.changed(lora), contextlib.chdir(tuned.path):
            finetune(tuned, "enc")
            evaluate.main()
            # the tiny preset: 2 layers of d 128, LoRA's A (4 × 128) and B (384 × 4) on each fused q, k, v;
            # STS-B's regression head
            trained = 2 * (4 * 128 + 384 * 4) + 128 + 1
            for init in INITS:
                summary = json.loads((out(tuned, init) / "summary.json").read_text())
                assert summary["method"] == "lora" and summary["trained_parameters"] == trained
                assert summary["total_parameters"] > 100 * trained
                predictions = pd.read_parquet(out(tuned, init) / "seed1/validation.parquet")
                assert not predictions["prediction"].equals(full[init]["prediction"])
            runs = mlflow.search_runs(
                experiment_names=["lmpipe"],
                filter_string="params.`finetune.method` = 'lora'",
                output_format="list",
            )
            assert len(runs) == 4
            assert {run.data.metrics["trained_parameters"] for run in runs} == {trained}
            assert {run.data.params["finetune.methods.lora.rank"] for run in runs} == {"4"}
            report = (tuned.path / "reports/glue.md").read_text()
            assert "*scratch* is then a random model, frozen the same way, with the same `lora`" in report
            assert f"| enc (encoder, mlm; lora: {trained / 1e3:.1f} k of " in report
            glue = json.loads((tuned.path / "metrics/glue.json").read_text())
            assert glue["enc"]["weights"] == {"trained": trained, "total": summary["total_parameters"]}
            assert not (out(tuned, "scratch") / "seed1/adapter").exists()  # nothing to load it onto
            adapter_predicts_as_the_stage(tuned, out(tuned, "pretrained") / "seed1")
    finally:
        with tuned.changed(OVERRIDES), contextlib.chdir(tuned.path):
            finetune(tuned, "enc")  # the module's other tests read full fine-tuning's outputs


def adapter_predicts_as_the_stage(workdir: Workdir, seed_dir: Path) -> None:
    """peft loads the fine-tune's adapter onto the model's transformers export (stage `export`): its
    predictions of the dev split are the stage's."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from lmpipe.finetuning import examples
    from lmpipe.glue.tasks import TASKS
    from lmpipe.params.finetune import FinetuneTaskParams
    from models.finetune_data import pad_batch
    from stages import export

    export.main(["enc"])
    base = AutoModelForSequenceClassification.from_pretrained(
        "checkpoints/enc/hf", num_labels=1, trust_remote_code=True
    )
    model = PeftModel.from_pretrained(base, seed_dir / "adapter").eval()
    recipe = FinetuneTaskParams(**{**DEFAULT_PARAMS["finetune"]["tasks"]["stsb"], "max_train_rows": 64})
    ids, pad = pad_batch(examples(TASKS["stsb"], recipe, DEFAULT_PARAMS["seed"]).eval_ids["validation"])
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=pad.long()).logits.squeeze(-1)
    want = pd.read_parquet(seed_dir / "validation.parquet")["prediction"].to_numpy()
    # the stage predicted under bf16 autocast where `auto` resolves to it; transformers in fp32
    bf16 = resolve_precision("auto", torch.device("cpu")) == "bf16-mixed"
    torch.testing.assert_close(got, torch.as_tensor(want), atol=1e-2 if bf16 else 1e-4, rtol=0)


def test_a_model_pretrained_on_another_tokenizer_is_refused(tuned: Workdir) -> None:
    config_path = tuned.path / "checkpoints/enc/final/config.json"
    original = config_path.read_text()
    before = (out(tuned, "pretrained") / "summary.json").read_bytes()
    config_path.write_text(json.dumps({**json.loads(original), "tokenizer_sha256": "0" * 64}))
    try:
        with (
            tuned.changed(OVERRIDES),
            pytest.raises(
                StageError,
                match=r"checkpoints/enc/final/config.json: the model was pretrained with tokenizer "
                r"000000000000, but data/tokenizer is [0-9a-f]{12}; re-run pretrain@enc",
            ),
        ):
            finetune(tuned, "enc")
    finally:
        config_path.write_text(original)
    assert (out(tuned, "pretrained") / "summary.json").read_bytes() == before  # no partial output


def test_a_model_can_have_its_own_recipe_values(tuned: Workdir) -> None:
    import mlflow

    own = {
        **OVERRIDES,
        "models": {"enc": MODEL, "enc_own": MODEL},
        "finetune.models": {"enc_own": {"epochs": 2, "lr": 3.0e-4}},
    }
    shutil.copytree(tuned.path / "checkpoints/enc/final", tuned.path / "checkpoints/enc_own/final")
    try:
        with tuned.changed(own):
            finetune(tuned, "enc_own")
            summary = json.loads((tuned.path / "data/finetune/enc_own/scratch/stsb/summary.json").read_text())
            assert summary["train_rows"] == 64 and summary["steps"] == 4  # 2 epochs of 2 batches
            runs = mlflow.search_runs(
                experiment_names=["lmpipe"], filter_string="tags.model = 'enc_own'", output_format="list"
            )
            assert sorted(run.data.tags["seed"] for run in runs) == ["1", "1", "2", "2"]
            for run in runs:  # the recipe as it trained, and where its values came from
                logged = run.data.params
                assert logged["finetune.tasks.stsb.epochs"] == "2"
                assert logged["finetune.tasks.stsb.lr"] == "0.0003"
                assert logged["finetune.tasks.stsb.max_train_rows"] == "64"
                assert logged["finetune.models.enc_own.lr"] == "0.0003"
            diverging, advice = {"finetune.models.enc_own.lr": 1.0e30}, r"lower finetune.models.enc_own.lr$"
            with tuned.changed(diverging), pytest.raises(StageError, match=advice):
                finetune(tuned, "enc_own")
    finally:
        shutil.rmtree(tuned.path / "data/finetune/enc_own", ignore_errors=True)
        shutil.rmtree(tuned.path / "checkpoints/enc_own")


def test_bad_names_and_params_are_one_line(tuned: Workdir) -> None:
    with tuned.changed(OVERRIDES):
        result = tuned.run("finetune", "nosuch")
        assert result.returncode == 2
        assert (
            result.stderr.strip() == "error: params.yaml: models.nosuch: no such model; the models are: enc"
        )


BAD_PARAMS = [
    (
        {"glue.tasks": ["stsb", "rte"], "finetune.tasks": {"stsb": {}}},
        r"finetune.tasks.rte: required, glue.tasks\[1\] is 'rte'",
    ),
    (
        {"finetune.tasks.stsb.max_len": 256},
        r"finetune.tasks.stsb.max_len \(256\) is longer than models.enc.max_len \(128\)",
    ),
    ({"finetune.tasks.sts": {}}, r"'sts' is not a GLUE task; the tasks are: cola, sst2"),
    ({"finetune.seeds": [1, 1]}, r"finetune.seeds.*seeds must be distinct"),
    ({"finetune.common.precision": "16-mixed"}, r"finetune.common.precision='16-mixed': Input should be"),
    ({"finetune.models": {"enc": {"lr": -1}}}, r"finetune.models.enc.lr=-1: Input should be greater than 0"),
    ({"finetune.method": "adapter"}, r"finetune.method='adapter': Input should be 'full', 'frozen', 'lora'"),
    (
        {"finetune.methods.lora.rank": 0},
        r"finetune.methods.lora.rank=0: Input should be greater than or equal",
    ),
    (
        {"finetune.methods.lora.targets": ["query"]},
        r"finetune.methods.lora.targets\[0\]='query': Input should",
    ),
    ({"finetune.methods.houlsby.rank": 8}, r"finetune.methods.houlsby.rank: unknown key"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_PARAMS)
def test_bad_finetune_params_stop_before_any_work(tuned: Workdir, overrides: dict, message: str) -> None:
    with tuned.changed({**OVERRIDES, **overrides}), pytest.raises(StageError, match=message):
        finetune(tuned, "enc")


def test_an_electra_discriminator_pretrains_exports_and_fine_tunes_on_every_task(
    sample_pipeline: Workdir,
) -> None:
    """ELECTRA's model through the stages: pretrain (generator and discriminator), the export of the
    discriminator (no fill-mask: its LM head was never trained) and a fine-tune of both inits on every
    task of the sample (a classification, a regression, a pair)."""
    model = {"arch": "encoder", "objective": "electra", "preset": "tiny"}
    from stages import export, glue_prepare

    tasks = DEFAULT_PARAMS["glue"]["tasks"]
    recipe = {
        f"finetune.tasks.{task}.{key}": value
        for task in tasks
        for key, value in (("max_train_rows", 32), ("epochs", 1))
    }
    overrides = {
        **OVERRIDES,
        "models": {"other": model},
        "glue.tasks": tasks,
        "finetune.seeds": [1],
        **recipe,
    }
    with sample_pipeline.changed(overrides):
        with contextlib.chdir(sample_pipeline.path):
            glue_prepare.main()
        run_stages(sample_pipeline, "pretrain", "other")
        with contextlib.chdir(sample_pipeline.path):
            export.main(["other"])
        finetune(sample_pipeline, "other")
        config = json.loads((sample_pipeline.path / "checkpoints/other/hf/config.json").read_text())
        assert ("custom_pipelines" in config) == (
            model["objective"] != "electra"
        )  # fill-mask: a trained head
        for task in tasks:
            for init in ("pretrained", "scratch"):
                summary = json.loads(
                    (sample_pipeline.path / "data/finetune/other" / init / task / "summary.json").read_text()
                )
                assert summary["train_rows"] == 32 and set(summary["seeds"]) == {"1"}
