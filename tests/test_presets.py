"""The presets as the papers' tables: every card names its paper and table, its rows expand and
validate on every profile, the ★ row is the baseline, equal-FLOPs rows get the baseline's budget, the
paper's effects are read against within-noise rows, `--plan` prints the card and runs nothing, and a
preset's sweep prints its card in the report and on its MLflow parent run."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from flows.ablation import baseline_index, equal_flops_budget, planned
from flows.common import PipelineError
from flows.presets import CARDS, effect
from flows.sweep import point_overrides
from tests.project import copy_project, sh
from tests.workdir import DEFAULT_PARAMS, ROOT


def plan_of(name: str, params: dict = DEFAULT_PARAMS, **options):
    return planned(name, None, params, **options)


def validated_points(name: str) -> tuple[list, object]:
    from flows.profile import validate

    plan = plan_of(name)
    overrides = [point_overrides(p, DEFAULT_PARAMS, ROOT / "params.yaml") for p in plan.values]
    return [validate(ROOT, point, "params.yaml") for point in overrides], plan


def test_the_cards_hold_the_papers_own_table_numbers_and_figures() -> None:
    """What the audit found: T5's BERT-style variants are its Table 5, span lengths Table 7, corruption
    rates Table 6 (i.i.d. rows); BERT's masking procedures are its Table 8 on MNLI; the seeds' BERT
    ablations that the paper does not contain set no figure beside."""
    assert CARDS["t5_objectives"].table.startswith("Table 5")
    assert CARDS["span_density"].table.startswith("Table 6")
    assert CARDS["span_length"].table.startswith("Table 7")
    assert CARDS["t5_approaches"].table.startswith("Table 4")
    density = plan_of("span_density")
    assert {point["objectives.span.noise_mask"] for point in density.values} == {"iid"}
    assert [row.figure for row in density.rows] == [82.82, 83.28, 83.00, 81.27]
    for preset in ("masking_rate", "positions", "depth_width", "pooling"):
        assert CARDS[preset].table.startswith("no table"), preset
        assert all(row.figure is None for row in plan_of(preset).rows), preset
    split = plan_of("mask_split")
    assert CARDS["mask_split"].table.startswith("Table 8") and split.rows[split.base].figure == 84.2
    assert effect(split.rows[1], split.rows) == pytest.approx(0.1)  # 100 % [MASK]: 84.3 on MNLI
    # ALBERT's ★ rows train with sentence-order prediction on segment pairs, as ALBERT's code does
    albert = plan_of("albert")
    assert all(p["objectives.mlm.pair_loss"] == "sop" and p["pack.sentences"] for p in albert.values)
    losses = plan_of("albert_sentence_loss")
    assert [p["objectives.mlm.pair_loss"] for p in losses.values] == ["none", "nsp", "sop"]
    assert [row.figure for row in losses.rows] == [79.0, 79.2, 80.1]


def test_systems_are_built_as_their_papers_built_them() -> None:
    """BERT with next-sentence prediction on segment pairs and segment embeddings, post-LN; GPT-1
    post-LN and fine-tuned with its auxiliary LM loss at 0.5; T5 with RMSNorm, no biases and its
    relative position bias."""
    plan = plan_of("systems")
    bert, gpt, t5 = plan.values
    assert plan.base == 0 and plan.rows[0].name == "BERT-Base"
    assert bert["models"]["bert"]["segment_embeddings"] and bert["models"]["bert"]["norm_position"] == "post"
    assert bert["models"]["bert"]["pretrain"]["input_format"] == "segment_pair"
    assert bert["objectives.mlm.pair_loss"] == "nsp" and bert["pack.sentences"]
    assert gpt["models"]["gpt"]["norm_position"] == "post" and gpt["finetune.common.lm_loss_weight"] == 0.5
    assert {key: t5["models"]["t5"][key] for key in ("norm", "bias", "positions")} == {
        "norm": "rmsnorm",
        "bias": False,
        "positions": "relative",
    }
    validated, _ = validated_points("systems")
    budget, words = equal_flops_budget(validated, plan.base)
    assert words.endswith("what bert spends on its 200 steps")


def test_rows_run_some_of_a_presets_table_against_its_baseline() -> None:
    """`--rows` keeps the ★ row (or the `--baseline` one) and the table's order; rows without the
    baseline, out of range, repeated, or with a grid are one line each."""
    every = plan_of("electra")
    kept = plan_of("electra", numbers=[3, 1])
    assert kept.values == [every.values[0], every.values[2]] and kept.base == 0
    assert [row.name for row in kept.rows] == ["BERT-Small", "ELECTRA-Small (generator 1/4)"]
    other = plan_of("electra", baseline={"objectives.electra.generator_width": 0.5}, numbers=[2, 4])
    assert other.values == [every.values[1], every.values[3]] and other.base == 1
    bad = {
        "[2, 3]": "the baseline, row 1, must be among them",
        "[1, 6]": "give distinct row numbers from 1 to 5 (preset electra)",
        "[1, 1]": "give distinct row numbers from 1 to 5 (preset electra)",
        "[]": "give distinct row numbers from 1 to 5 (preset electra)",
    }
    for rows, message in bad.items():
        with pytest.raises(PipelineError, match=re.escape(f"--rows {rows}: {message}")):
            plan_of("electra", numbers=json.loads(rows))
    with pytest.raises(PipelineError, match="--rows picks a preset's rows; with --grid give only"):
        planned(None, [{"pretrain.lr": 0.1}], DEFAULT_PARAMS, numbers=[1])
    with pytest.raises(PipelineError, match=r'baseline \{"objectives.mlm.mask_rate": 0.3\}: no point'):
        plan_of("masking_rate", baseline={"objectives.mlm.mask_rate": 0.3})
    assert baseline_index(plan_of("masking_rate").values, {"objectives.mlm.mask_rate": 0.25}) == 3


def test_set_params_give_a_presets_rows_another_budget(tmp_path: Path) -> None:
    """`--set-params` go between the profile and the points: T5's objective rows, made from
    encdec_span, take the budget set for it; a bad key is one line before any flow starts."""
    from flows.ablation import check
    from flows.sweep import Sweep

    (tmp_path / "SST-2").mkdir()
    budget = {"models.encdec_span.pretrain.max_steps": 1000}
    sweep = Sweep("ablation", str(ROOT), "t", 1, "real-cpu", str(tmp_path), str(tmp_path), set_params=budget)
    points = planned("t5_objectives", None, sweep.params).values
    steps = {
        name: sweep.validate(sweep.overrides(point)).pretrain_of(name).max_steps
        for point in points
        for name in point["models"]
    }
    assert steps == {"bert_style": 1000, "mass_style": 1000, "replace_spans": 1000, "drop": 1000}
    arguments = {"repo": str(ROOT), "preset": "t5_objectives", "baseline": None, "grid": None, "rows": None}
    arguments |= {"profile": "real-cpu", "corpus": str(tmp_path), "glue": str(tmp_path)}
    check(arguments | {"set_params": budget})
    with pytest.raises(PipelineError) as caught:
        check(arguments | {"set_params": {"models.encdec_span.pretrain.max_step": 1000}})
    assert str(caught.value).startswith("profile real-cpu with --set-params: models.encdec_span.pretrain")
    assert "max_step" in str(caught.value) and "\n" not in str(caught.value)


def test_depth_width_rows_have_the_same_block_weights_and_train_on_equal_flops() -> None:
    """12 × 768 against 6 × 1088: the same matmul weights in their blocks (6·1088² ≈ 12·768²), so the
    same FLOPs a token but the LM head's; the sweep gives both the baseline's FLOPs."""
    from models.stack_flops import block_weights

    validated, plan = validated_points("depth_width")
    assert plan.values[1] == {
        "models": {"encoder_wide": {"from": "encoder_mlm", "n_layers": 1, "d_model": 180, "d_ff": 725}}
    }
    deep, wide = (
        params.models[name].config_fields()
        for params, name in zip(validated, ("encoder_mlm", "encoder_wide"), strict=True)
    )
    weights = [f["n_layers"] * block_weights(f["d_model"], f["d_ff"], "gelu") for f in (deep, wide)]
    assert abs(weights[1] / weights[0] - 1) < 0.01, weights
    _, words = equal_flops_budget(validated, plan.base)
    assert words.endswith("what encoder_mlm spends on its 200 steps")


def test_albert_rows_cut_parameters_not_flops_and_train_on_equal_flops() -> None:
    """ALBERT's rows at the default's tiny encoder (d 128: E 24, BERT-base's 128/768): each reduction
    cuts parameters, together the most; a shared block costs what its unshared layers do."""
    from lmpipe.pretraining import budget
    from models.transformer import Transformer

    validated, plan = validated_points("albert")
    assert plan.values[1]["models"]["encoder_factorized"]["embedding_size"] == 24
    vocab = DEFAULT_PARAMS["tokenizer"]["vocab_size"]
    size, step = {}, {}
    for params in validated:
        (name,) = params.models
        size[name] = Transformer(params.models[name].config(vocab)).num_parameters()
        step[name] = budget(params, name, vocab).step_flops
    assert size["encoder_bert"] > size["encoder_factorized"] > size["encoder_albert"]
    assert size["encoder_bert"] > size["encoder_shared"] > size["encoder_albert"]
    assert (
        step["encoder_shared"] == step["encoder_bert"]
        and step["encoder_albert"] == step["encoder_factorized"]
    )
    _, words = equal_flops_budget(validated, plan.base)
    assert words.endswith("what encoder_bert spends on its 200 steps")


def test_electra_rows_pay_for_their_generator_in_steps_at_equal_flops() -> None:
    """MLM against ELECTRA at four generator widths: a wider generator costs more a step, so at the
    MLM's FLOPs each ELECTRA row gets fewer steps, the widest the fewest."""
    from lmpipe.pretraining import budget

    validated, plan = validated_points("electra")
    assert [p.get("objectives.electra.generator_width") for p in plan.values] == [None, 0.125, 0.25, 0.5, 1.0]
    flops, words = equal_flops_budget(validated, plan.base)
    assert words.endswith("what encoder_mlm spends on its 200 steps")
    vocab = DEFAULT_PARAMS["tokenizer"]["vocab_size"]
    steps = []
    for params in validated:
        (name,) = params.models
        at_budget = params.model_copy(
            update={"pretrain": params.pretrain.model_copy(update={"max_flops": flops})}
        )
        steps.append(budget(at_budget, name, vocab).steps)
        assert budget(params, name, vocab).steps == 200
    assert steps[0] == pytest.approx(200) and 200 > steps[1] > steps[2] > steps[3] > steps[4], steps


def test_t5_table_rows_have_the_tables_parameters_and_costs() -> None:
    """T5's Table 2 at the profile's size, counted by the project's own code: the encoder-decoder 2P
    at cost M, shared P at M, half depth P at M/2, the decoder-only and prefix LMs P at M; equal FLOPs
    but the half-depth rows, which get half (the cost the table gives them)."""
    import torch

    from lmpipe.pretraining import budget
    from models.transformer import Transformer

    def stacks(config) -> int:  # the parameters of the stacks, not the embeddings T5's P leaves out
        with torch.device("meta"):
            model = Transformer(config)
        return sum(
            p.numel() for name, p in model.named_parameters() if name.startswith(("encoder", "decoder"))
        )

    validated, plan = validated_points("t5_architectures")
    assert len(plan.values) == 10 and plan.base == 0
    vocab = DEFAULT_PARAMS["tokenizer"]["vocab_size"]
    size, step = {}, {}
    for params in validated:
        (name,) = params.models
        size[name] = stacks(params.models[name].config(vocab))
        step[name] = budget(params, name, vocab).step_flops
    for objective in ("denoise", "lm"):
        p, m = size[f"decoder_{objective}"], step[f"encdec_{objective}"]
        assert size[f"prefix_lm_{objective}"] == p
        assert 2 * p < size[f"encdec_{objective}"] < 2.5 * p  # 2P: two stacks and cross-attention
        for one_stack in ("encdec_shared", "encdec_half"):
            assert p < size[f"{one_stack}_{objective}"] < 1.4 * p, one_stack
        assert step[f"encdec_shared_{objective}"] == m
        assert 0.45 * m < step[f"encdec_half_{objective}"] < 0.6 * m  # the LM head is not halved
        for decoder in ("decoder", "prefix_lm"):  # inputs and targets through one stack: about M
            assert 0.85 * m < step[f"{decoder}_{objective}"] <= m, decoder
    flops, _ = equal_flops_budget(validated, 0)
    assert flops == budget(validated[0], "encdec_denoise", vocab).train_flops
    assert [row.cost for row in plan.rows] == [1, 1, 0.5, 1, 1] * 2


def test_within_noise_points_are_read_against_the_papers_effect_size() -> None:
    from flows.ablation import power_lines

    plan = plan_of("span_density")
    names, effects = zip(*plan.paper(), strict=True)
    assert names == ("10%", "15%", "25%", "50%")
    table = pd.DataFrame(
        {
            "experiment": ["d10", "d15", "d25", "d50"],
            "paper_row": names,
            "paper_effect": effects,
            "vs_baseline_verdict": ["within noise", "baseline", "within noise", "worse"],
            "vs_baseline_detectable": [2.9, float("nan"), 0.2, 0.3],
            "glue_average_std": [0.5, 0.4, 0.1, 0.6],
        }
    )
    # 3 seeds: the seeds' spread widens what is detectable; d50 has a verdict of its own
    assert power_lines(table, plan.card, 3) == [
        "- `d10`: T5 (Raffel et al., 2020), Table 6 (corruption rate) (10%) measured -0.5; this comparison "
        "detects ±3.08 (±2.90 from the dev examples, and the seeds' std: 0.50 here, 0.40 at the baseline, "
        "over 3 seeds): the dev examples alone miss 0.5 at any number of seeds; about 39.7× the dev examples "
        "would detect it, or a budget at which the effect is larger.",
        "- `d25`: T5 (Raffel et al., 2020), Table 6 (corruption rate) (25%) measured -0.3; this comparison "
        "detects ±0.70 (±0.20 from the dev examples, and the seeds' std: 0.10 here, 0.40 at the baseline, "
        "over 3 seeds): about 35 seeds per point would detect 0.3.",
    ]
    assert power_lines(table, None, 3) == []
    # a card with no figure for a row sets nothing beside it
    rates = plan_of("masking_rate")
    unmeasured = [effect for _, effect in rates.paper()][:4]
    assert power_lines(table.assign(paper_effect=unmeasured), rates.card, 3) == []


def test_plan_prints_the_card_the_points_and_their_cost_and_runs_nothing() -> None:
    """`--plan`: the card with the paper's rows and figures, each point's params against the baseline,
    its steps and FLOPs and an estimated time here; no flow, no experiment, no MLflow run."""
    planned_out = sh(
        ROOT, sys.executable, "-m", "flows.ablation", "gpt1_aux_loss", "--plan", PREFECT_API_URL=None
    )
    out = planned_out.stdout
    assert out.startswith("# `gpt1_aux_loss`: GPT-1 (Radford et al., 2018), Table 5 (ablations)")
    assert "| 1 | **Transformer w/ aux LM (full)** ★ | 74.7 |  |" in out
    assert "| 2 | Transformer w/o aux LM | 75.0 | +0.30 |" in out
    assert "finetune.common.lm_loss_weight: 0.0" in out and "(the baseline)" in out
    assert "| steps | 100 epochs of 64 × 512 | 200 steps of 16 × 128, lr 0.001 |" in out
    assert re.search(r"Estimated on this machine \(.+\): [\d.]+ GFLOP/s", out)
    assert "Flow run" not in planned_out.stderr  # no Prefect flow started
    bad = sh(ROOT, sys.executable, "-m", "flows.ablation", "electra", "--rows", "[2]", "--plan", check=False)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: --rows [2]: the baseline, row 1, must be among them"
    )


@pytest.mark.slow
def test_a_presets_sweep_prints_its_card_in_the_report_and_on_its_mlflow_run(
    reproduced_template: Path, tmp_path: Path
) -> None:
    """Two rows of the pooling card (fine-tuning only: the one pretrained encoder is reused): the
    report sets the paper's row names and effects beside ours, and the parent run holds the card."""
    project = copy_project(reproduced_template, tmp_path / "project")
    sh(project, "git", "add", "-A")
    sh(project, "git", "commit", "-qm", "baseline reproduced")
    command = [sys.executable, "-m", "flows.ablation", "pooling", "--rows", "[1, 2]", "--name", "carded"]
    sh(
        project,
        *command,
        MLFLOW_TRACKING_URI=None,
        PREFECT_API_URL=None,
        PREFECT_HOME=str(tmp_path / "prefect"),
    )
    out = project / "reports/ablation/carded"
    report = (out / "comparison.md").read_text()
    assert "## The paper's table" in report and "no table: BERT classifies from [CLS]" in report
    assert "| 1 | **[CLS]** ★ | — |  |" in report
    table = pd.read_csv(out / "comparison.csv")
    assert table["paper_row"].tolist() == ["[CLS]", "mean"]
    assert (out / "card.md").read_text().startswith("**BERT (Devlin et al., 2019), no table")
    client = mlflow.MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lmpipe")
    [parent] = client.search_runs(
        [experiment.experiment_id], "tags.sweep = 'carded' and tags.stage = 'ablation'"
    )
    assert parent.data.tags["paper"] == "BERT (Devlin et al., 2019)"
    assert "card.md" in {artifact.path for artifact in client.list_artifacts(parent.info.run_id)}


def test_the_docs_table_of_presets_and_the_readme_status_are_made_from_the_cards_and_the_log() -> None:
    from flows.presets.__main__ import DOC, README, current, current_status

    assert current(DOC.read_text()) == DOC.read_text(), "python -m flows.presets --write"
    assert current_status(README.read_text()) == README.read_text(), "python -m flows.presets --write"


def test_the_status_reads_each_research_entry_that_names_a_preset(tmp_path: Path, monkeypatch) -> None:
    from flows.presets import __main__ as made

    (tmp_path / "2026-01.md").write_text(
        "# Research log\n\n## 2026-01-02, late: ELECTRA at 60 minutes: `worse`\n\n"
        "Preset: `electra` (rows 1 and 3).\n\nThe run.\n\n"
        "## 2026-01-01: the two tables: both within noise\n\nPreset: `masking`, `pooling`.\n\n"
        "## 2026-01-01: a profile run\n\nNo preset here; `systems` is only mentioned.\n"
    )
    (tmp_path / "presets-on-real-text.csv").write_text(
        "preset,points,minutes,day,cpu,sweep\npooling,3,14.9,2026-01-03,a CPU,smoke-pooling\n"
    )
    monkeypatch.setattr(made, "RESULTS", tmp_path)
    monkeypatch.setattr(made, "REAL_TEXT", tmp_path / "presets-on-real-text.csv")
    assert made.research_runs() == {
        "electra": [
            "[2026-01-02, late](docs/results/2026-01.md): ELECTRA at 60 minutes: `worse` (rows 1 and 3)"
        ],
        "masking": ["[2026-01-01](docs/results/2026-01.md): the two tables: both within noise"],
        "pooling": ["[2026-01-01](docs/results/2026-01.md): the two tables: both within noise"],
    }
    lines = {line.split(" | ")[0]: line for line in made.status_table().splitlines()}
    assert "| 2026-01-03, 3 points, 14.9 min | [2026-01-01]" in lines["| `pooling`"]
    assert lines["| `systems`"].endswith("| not yet | none yet |")
    (tmp_path / "2026-01.md").write_text("## 2026-01-04: a run\n\nPreset: `no_such_preset`.\n")
    with pytest.raises(SystemExit, match="no card has: no_such_preset"):
        made.status_table()


def test_the_plans_fine_tuning_cost_counts_factorized_embeddings_at_their_width() -> None:
    """Fine-tuning's FLOPs are 6 per weight and token less the embedding lookup, which for ALBERT's
    factorized embeddings is V·E, not V·d (it came out negative)."""
    import copy

    from flows.plan import finetune_flops
    from lmpipe.params.project import parse_params
    from models.transformer import Transformer

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["models"] = {
        "albert": {"arch": "encoder", "objective": "mlm", "preset": "tiny", "embedding_size": 16}
    }
    params = parse_params(raw)
    config = params.models["albert"].config(params.tokenizer.vocab_size)
    parameters = Transformer(config).num_parameters()
    jobs, flops = finetune_flops(params, "albert", parameters, ROOT)
    weights = parameters - params.tokenizer.vocab_size * 16
    assert jobs > 0 and weights > 0 and flops > 0
