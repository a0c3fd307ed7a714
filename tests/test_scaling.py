"""The scaling sweep: the law's fit on known data, and a CI-sized ladder on the default profile
through DVC experiments, with its report, plot and MLflow parent."""

from __future__ import annotations

import math
import os
from pathlib import Path

import mlflow
import numpy as np
import pytest

from flows.ablation import main as ablation_main
from flows.common import PipelineError
from flows.scaling import budget_override, fit_law, fit_power, ladder_points, law, non_embedding_parameters
from flows.scaling import main as scaling_main
from tests.project import copy_project, sh
from tests.workdir import DEFAULT_PARAMS


def test_fit_recovers_a_known_law_with_its_uncertainty() -> None:
    n = np.geomspace(1e5, 5e6, 6)
    noise = np.random.default_rng(0).normal(0, 0.005, len(n))
    fit = fit_law(n, law(n, 40.0, 0.25, 2.0) + noise)
    assert abs(fit.alpha - 0.25) < 3 * fit.errors[1] + 0.02 and fit.errors[1] > 0
    assert abs(fit.c - 2.0) < 3 * fit.errors[2] + 0.05
    assert fit.extrapolated_n == 5e7
    assert abs(fit.extrapolated_loss - law(5e7, 40.0, 0.25, 2.0)) < 3 * fit.extrapolated_error + 0.02


def test_kaplans_form_recovers_a_pure_power_law() -> None:
    n = np.geomspace(1e5, 5e6, 5)
    exact = fit_power(n, (8.8e13 / n) ** 0.076)  # Kaplan's N_c and α_N
    assert exact.alpha == pytest.approx(0.076) and exact.error == pytest.approx(0.0, abs=1e-9)
    # with an irreducible term the no-c form sees a shallower slope than the law's own α
    assert fit_power(n, law(n, 40.0, 0.25, 2.0)).alpha < 0.25


def test_ladder_and_budgets() -> None:
    assert non_embedding_parameters(128, 2, 512) == 2 * (4 * 128 * 128 + 2 * 128 * 512)  # `tiny`: 393,216
    points = ladder_points([(128, 2, 2), (192, 2, 3), (256, 3, 4), (320, 4, 5)])
    assert points[1] == {
        "models": "decoder_clm",
        "++models.decoder_clm.d_model": 192,
        "++models.decoder_clm.n_layers": 2,
        "++models.decoder_clm.n_heads": 3,
        "++models.decoder_clm.d_ff": 768,
    }
    override, steps = budget_override(393_216, 2048, 20.0)  # 7.9 M tokens at 2,048 a step
    assert steps == math.ceil(20 * 393_216 / 2048) == 3840
    assert override == "++models.decoder_clm.pretrain={max_steps:3840,warmup_steps:384,max_minutes:null}"
    with pytest.raises(PipelineError, match="at least 4 sizes"):
        ladder_points([(128, 2, 2)] * 3)
    with pytest.raises(PipelineError, match="not divisible"):
        ladder_points([(128, 2, 3)] * 4)


def test_bad_scaling_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert scaling_main(["--sizes", "[[64, 2]]"]) == 2
    assert scaling_main(["--sizes", "[[64, 2, 2]"]) == 2
    assert scaling_main(["--tokens-per-parameter", "0"]) == 2
    assert ablation_main(["scaling"]) == 2  # a sweep of its own, not an ablation preset
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0] == (
        "error: scaling: give sizes as a list of [d_model, n_layers, n_heads], e.g. [[128, 2, 2], ...]"
    )
    assert errors[1].startswith("error: --sizes is not JSON: ")
    assert errors[2] == "error: --tokens-per-parameter must be > 0"
    assert errors[3].startswith("error: preset 'scaling' is unknown (presets: masking_rate, ")
    assert len(errors) == 4


@pytest.mark.slow  # in `make test` and CI; `-m "not slow"` leaves it out
def test_ci_sized_ladder_fits_the_law(reproduced_template: Path, tmp_path: Path) -> None:
    from prefect.testing.utilities import prefect_test_harness

    from flows.scaling import scaling

    def one_decoder(params: dict) -> None:  # the default decoder: the ladder pretrains only
        params["models"] = {"decoder_clm": DEFAULT_PARAMS["models"]["decoder_clm"]}
        params["pretrain"].update(val_every=1000, checkpoint_every=1000)

    project = copy_project(reproduced_template, tmp_path / "project", one_decoder)
    assert "up to date" in sh(project, "dvc", "status", "--with-deps", "pack").stdout  # the data stays
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "one decoder")
    sizes = [(32, 1, 2), (48, 1, 2), (64, 2, 2), (96, 2, 2)]
    with prefect_test_harness(server_startup_timeout=60):
        ladder = {"name": "ladder", "tokens_per_parameter": 1.0, "sizes": sizes, "max_parallel": 2}
        result = scaling(repo=str(project), **ladder)

    rows = result["rows"]
    n = [row["n"] for row in rows]
    assert n == [non_embedding_parameters(d, layers, 4 * d) for d, layers, _ in sizes]
    assert [row["steps"] for row in rows] == [max(10, math.ceil(x / 2048)) for x in n]
    assert [row["tokens"] for row in rows] == [
        row["steps"] * 2048 for row in rows
    ]  # what each one trained on
    fit = result["fit"]
    assert fit is not None and fit["alpha"] > 0
    losses = np.array([row["val_loss"] for row in rows])
    assert losses[-1] < losses[0]  # the largest model beats the smallest on the same tokens per parameter
    report = project / "reports/ablation/ladder"
    text = (report / "scaling.md").read_text()
    assert f"α = {fit['alpha']:.3f}" in text and "10× the largest" in text and "Synthetic data" in text
    assert (report / "scaling.png").stat().st_size > 0
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    parent = client.get_run(result["parent_run_id"])
    assert parent.data.metrics["alpha"] == pytest.approx(fit["alpha"])
    assert parent.data.metrics["alpha_kaplan_form"] == pytest.approx(fit["alpha_kaplan_form"])
    assert f"α_N = {fit['alpha_kaplan_form']:.3f}" in text
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "scaling.md",
        "scaling.png",
        "scaling.csv",
    }
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    assert sorted(run.data.metrics["n"] for run in children) == n
    shown = sh(project, "dvc", "exp", "show", "--csv").stdout
    assert all(f"ladder-{i}" in shown for i in range(1, 5))
