"""DistilBERT's distillation: the student's layers copied from the teacher's, the loss as its code
computes it, the frozen teacher, the `distill` params' one-line errors, and a student through real DVC
(distilled from the pretrained teacher, then exported, fine-tuned and reported as a model; stale when
its teacher is)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from lmpipe.params.distill import every_other_layer
from lmpipe.params.pretrain import PretrainParams, objectives_params
from lmpipe.params.project import parse_params
from lmpipe.pretraining import train_config as pretraining_config
from lmpipe.runtime import StageError
from models.config import ModelConfig
from models.distillation import DistillConfig, DistillModule, distillation_losses
from models.pretraining import TrainConfig, make_batch
from models.transformer import Transformer
from tests.pipeline_helpers import stage_main
from tests.project import changed_deps, copy_project, dvc, stages_ran
from tests.workdir import DEFAULT_PARAMS

VOCAB = 300


def configs(arch: str = "encoder", layers: int = 4) -> ModelConfig:
    return ModelConfig(
        arch=arch, vocab_size=VOCAB, d_model=32, n_layers=layers, n_heads=2, d_ff=64, max_len=32
    )


def train_config(arch: str = "encoder", objective: str = "mlm") -> TrainConfig:
    run = PretrainParams(seq_len=32, batch_size=4)
    return pretraining_config(arch, objective, run, objectives_params(), seed=1)


def batch_of(train: TrainConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(5, VOCAB, (4, train.row_length()), generator=generator)
    return make_batch(rows, train, generator, VOCAB)


def student_of(
    teacher: Transformer, layers: tuple[int, ...], arch: str = "encoder", **loss: float
) -> DistillModule:
    weights = {"temperature": 2.0, "alpha_ce": 5.0, "alpha_mlm": 2.0, "alpha_cos": 1.0} | loss
    distill = DistillConfig(teacher.cfg, layers, "teacher", *weights.values())
    objective = "mlm" if arch == "encoder" else "clm"
    module = DistillModule(teacher.cfg.with_(n_layers=len(layers)), train_config(arch, objective), distill)
    module.init_from(teacher.state_dict())
    return module


def test_every_other_layer_is_distilberts() -> None:
    # scripts/extract_distilbert.py: BERT-base's layers 0, 2, 4, 7, 9, 11
    assert every_other_layer(12) == [0, 2, 4, 7, 9, 11]
    assert every_other_layer(24) == [0, 2, 4, 6, 8, 10, 13, 15, 17, 19, 21, 23]
    assert every_other_layer(4) == [0, 3] and every_other_layer(2) == [0]


@pytest.mark.parametrize("arch", ["encoder", "decoder"])
def test_the_student_is_the_teachers_layers(arch: str) -> None:
    torch.manual_seed(0)
    teacher = Transformer(configs(arch)).eval()
    student = student_of(teacher, (0, 3), arch).model.eval()
    assert torch.equal(student.stack().blocks[1].mlp.up.weight, teacher.stack().blocks[3].mlp.up.weight)
    assert torch.equal(student.embed.weight, teacher.embed.weight)
    # every layer copied: the student computes the teacher's states, bit for bit
    whole = student_of(teacher, (0, 1, 2, 3), arch).model.eval()
    ids = torch.randint(5, VOCAB, (2, 16))
    assert torch.equal(whole(ids), teacher(ids))
    # and a student of all layers learns nothing from its teacher: both losses are zero
    module = student_of(teacher, (0, 1, 2, 3), arch).eval()
    terms = module.terms(batch_of(module.cfg))
    assert terms.extra["soft_targets"][0].abs() < 1e-6 and terms.extra["cosine"][0].abs() < 1e-6


def test_the_loss_is_the_distiller_s() -> None:
    """transformers' research_projects/distillation/distiller.py: KLDivLoss(batchmean) of the tempered
    distributions × T², and CosineEmbeddingLoss with target 1 on the hidden states."""
    torch.manual_seed(1)
    s_logits, t_logits = torch.randn(10, VOCAB), torch.randn(10, VOCAB)
    s_hidden, t_hidden = torch.randn(10, 32), torch.randn(10, 32)
    temperature = 2.0
    expected_ce = (
        nn.KLDivLoss(reduction="batchmean")(
            nn.functional.log_softmax(s_logits / temperature, dim=-1),
            nn.functional.softmax(t_logits / temperature, dim=-1),
        )
        * temperature**2
    )
    expected_cos = nn.CosineEmbeddingLoss(reduction="mean")(s_hidden, t_hidden, torch.ones(10))
    ce, cosine = distillation_losses(s_logits, t_logits, s_hidden, t_hidden, temperature)
    assert torch.allclose(ce, expected_ce) and torch.allclose(cosine, expected_cos)


def test_the_step_sums_the_weighted_losses_and_the_teacher_stays_frozen() -> None:
    torch.manual_seed(2)
    teacher = Transformer(configs())
    module = student_of(teacher, (0, 3), alpha_ce=3.0, alpha_mlm=0.5, alpha_cos=4.0)
    module.train()
    assert not module.teacher.training and all(not p.requires_grad for p in module.teacher.parameters())
    terms = module.terms(batch_of(module.cfg))
    ce, cosine = terms.extra["soft_targets"][0], terms.extra["cosine"][0]
    assert torch.allclose(terms.total(), 0.5 * terms.loss + 3.0 * ce + 4.0 * cosine)
    terms.total().backward()
    assert all(p.grad is None for p in module.teacher.parameters())
    assert module.model.stack().blocks[0].mlp.up.weight.grad is not None


def params_with(entry: dict, **models: dict) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(DEFAULT_PARAMS))
    raw["models"] = {"teacher": {"arch": "encoder", "objective": "mlm", "preset": "small"}, **models}
    raw["distill"] = {"students": {"student": entry}}
    return raw


STUDENT = {"teacher": "teacher", "arch": "encoder", "objective": "mlm"}


def test_a_student_is_its_teachers_model_with_half_the_layers() -> None:
    params = parse_params(params_with(STUDENT | {"pretrain": {"max_steps": 70}}))
    student = params.models["student"]
    assert student.config() == params.models["teacher"].config().with_(n_layers=2)
    assert params.pretrain_of("student").max_steps == 70 and params.student("student").alpha_ce == 5.0
    assert params.pretrain_key("student", "max_steps") == "distill.students.student.pretrain.max_steps"


@pytest.mark.parametrize(
    ("student", "models", "message"),
    [
        (STUDENT | {"teacher": "nope"}, {}, "distill.students.student.teacher: no model 'nope'"),
        (STUDENT | {"arch": "decoder"}, {}, "distill.students.student.arch: 'decoder', not its teacher's"),
        (STUDENT | {"layers": [0, 4]}, {}, "distill.students.student.layers: [0, 4]: models.teacher has 4"),
        (
            STUDENT | {"layers": [2, 1]},
            {},
            "distill.students.student.layers: [2, 1]: the teacher's layers, distinct, ascending",
        ),
        (STUDENT | {"alpha_cos": -1}, {}, "distill.students.student.alpha_cos=-1"),
        (STUDENT, {"distil": {"arch": "encoder", "objective": "mlm"}}, "models.distil exists"),
        (
            {"teacher": "gen", "arch": "encoder", "objective": "electra"},
            {"gen": {"arch": "encoder", "objective": "electra"}},
            "objective electra trains a head of its own",
        ),
        (
            {"teacher": "s2s", "arch": "encoder_decoder", "objective": "span"},
            {"s2s": {"arch": "encoder_decoder", "objective": "span"}},
            "one transformer stack",
        ),
    ],
)
def test_what_cannot_be_a_student_is_one_line(student: dict, models: dict, message: str) -> None:
    raw = params_with(student, **models)
    if "distil" in models:  # a student named as a model
        raw["distill"]["students"] = {"distil": student}
    with pytest.raises(StageError, match="^params.yaml: ") as caught:
        parse_params(raw, "params.yaml")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_student_through_dvc(reproduced_template: Path, tmp_path: Path) -> None:
    def add_student(params: dict) -> None:
        params["distill"]["students"] = {
            "distil": {"teacher": "encoder_mlm", "arch": "encoder", "objective": "mlm"}
        }

    repo = copy_project(reproduced_template, tmp_path / "repo", add_student)
    ran = stages_ran(dvc(repo, "repro"))
    # the student trains from the pretrained teacher; nothing of the teacher's runs again
    assert set(ran) == {"distill@distil", "export_student@distil", "finetune_student@distil", "evaluate"}
    metrics = json.loads((repo / "metrics/pretrain/distil.json").read_text())
    assert metrics["teacher"] == "encoder_mlm" and metrics["teacher_layers"] == [0]
    assert metrics["distill_flops_per_step"] > metrics["flops_per_step"]
    config = json.loads((repo / "checkpoints/distil/final/config.json").read_text())
    assert config["model"]["n_layers"] == 1 and config["stage"] == "distill@distil"
    assert (repo / "checkpoints/distil/hf/model.safetensors").exists()
    glue = json.loads((repo / "metrics/glue.json").read_text())
    assert set(glue) >= {"encoder_mlm", "distil"} and "stsb" in glue["distil"]["pretrained"]
    assert (
        "| distil (encoder, mlm; distilled from encoder_mlm) | pretrained |"
        in (repo / "reports/glue.md").read_text()
    )
    assert stages_ran(dvc(repo, "repro")) == []

    # a new teacher makes its student stale, through the teacher's checkpoint
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["models"]["encoder_mlm"]["dropout"] = 0.05
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stale = changed_deps(repo)
    assert {"pretrain@encoder_mlm", "distill@distil"} <= {name.split(":")[-1] for name in stale}


def test_a_student_is_trained_by_its_own_stage_alone(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_with(STUDENT)))
    with contextlib.chdir(tmp_path):
        with pytest.raises(StageError, match="distill.students.student: a student; stage distill@student"):
            stage_main("pretrain")(["student"])
        with pytest.raises(StageError, match="distill.students.teacher: no such student; the students are"):
            stage_main("distill")(["teacher"])


def test_the_distilbert_preset_reports_each_rows_model_against_the_student() -> None:
    """Its ★ point trains the teacher and the student: the comparison reports the student there and
    compares every row's model (the teacher's too) with it; a row's difference from the ★ point reads
    as the student it lacks or changes, not as every key of it."""
    from flows import profile as profiles
    from flows.ablation import planned
    from flows.plan import against
    from flows.sweep import point_overrides
    from tests.workdir import ROOT

    plan = planned("distilbert", None, DEFAULT_PARAMS)
    assert plan.reported() == ["encoder_mlm", "distilbert", "small_bert", "distilbert_random"]
    assert plan.rows[plan.base].model == "distilbert"
    validated = [
        profiles.validate(ROOT, point_overrides(point, DEFAULT_PARAMS, ROOT / "params.yaml"), "params.yaml")
        for point in plan.values
    ]
    star = validated[plan.base]
    assert star.models["distilbert"].config() == star.models["encoder_mlm"].config().with_(n_layers=1)
    assert against(validated[0], star) == "distill.student: —"
    assert against(validated[2], star) == "model.n_layers: 1; distill.student: —"
    assert against(validated[3], star) == "distill.student.init: random"
