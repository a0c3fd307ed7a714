from __future__ import annotations

from collections.abc import Iterator

import pytest

from lmpipe.params.project import load_params, parse_params
from lmpipe.runtime import StageError
from tests.workdir import DEFAULT_PARAMS, ROOT


def test_repository_params_are_valid() -> None:
    params = load_params(ROOT / "params.yaml")
    assert params.ingest.sources["sample"].synthetic
    assert params.tokenizer.vocab_size == DEFAULT_PARAMS["tokenizer"]["vocab_size"]


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("clean.min_wrods", 3, "clean.min_wrods: unknown key"),
        ("clean.min_words", "many", "clean.min_words='many': Input should be a valid integer"),
        ("clean.min_words", -1, "clean.min_words=-1: Input should be greater than or equal to 0"),
        ("pack.val_fraction", 1.5, "pack.val_fraction=1.5: Input should be less than 1"),
        (
            "tokenizer.model_type",
            "wordpiece",
            "tokenizer.model_type='wordpiece': Input should be 'unigram' or 'bpe'",
        ),
        ("clean.near_dedup.threshold", 0, "clean.near_dedup.threshold=0: Input should be greater than 0"),
        ("ingest.encoding_errors", "ignore", "ingest.encoding_errors='ignore'"),
        ("pack.repeat", {"sample": 0}, "pack.repeat.sample=0: Input should be greater than or equal to 1"),
    ],
)
def test_bad_value_names_the_dotted_key(dotted: str, value: object, expected: str) -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    *parents, last = dotted.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[last] = value
    with pytest.raises(StageError) as info:
        parse_params(raw)
    message = str(info.value)
    assert "\n" not in message
    assert expected in message


def assert_params_error(changes: dict, expected: str) -> None:
    """DEFAULT_PARAMS with `changes` ({section: {key: value}}; a dict value updates a dict key, any other
    replaces it) fail validation in one line containing `expected`."""
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    for section, values in changes.items():
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(raw[section].get(key), dict):
                raw[section][key].update(value)
            else:
                raw[section][key] = value
    with pytest.raises(StageError) as info:
        parse_params(raw)
    assert "\n" not in str(info.value)
    assert expected in str(info.value)


def test_conflicting_options_are_rejected() -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["clean"]["min_chars"], raw["clean"]["max_chars"] = 500, 100
    with pytest.raises(StageError, match=r"clean: min_chars \(500\) must be <= max_chars \(100\)"):
        parse_params(raw)
    raw = copy.deepcopy(DEFAULT_PARAMS)
    cases = [
        ({"kind": "files"}, r"ingest.sources.x.path: required key is missing"),
        ({"path": "a/*.txt"}, r"ingest.sources.x.path='a/\*.txt': 'a/\*.txt' is a pattern: give the folder"),
        ({"path": "../corpus"}, r"'../corpus' leaves the project: give a folder outside it as an absolute"),
        ({"path": "a", "include": ["/abs/*.txt"]}, r"item 0, '/abs/\*.txt', must be a pattern relative"),
        ({"kind": "glue", "path": "data/glue", "split": "dev"}, r"a 'glue' source reads the train splits"),
        ({"path": "a.txt", "tasks": ["sst2"]}, r"sources.x: 'tasks' is for 'glue' sources, not 'files'"),
        ({"kind": "disk", "path": "d", "include": ["*.txt"]}, r"'include' is for 'files' sources"),
    ]
    for source, message in cases:
        raw = copy.deepcopy(DEFAULT_PARAMS)
        raw["ingest"]["sources"] = {"x": source}
        with pytest.raises(StageError, match=message):
            parse_params(raw)
    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["ingest"]["sources"] = {"a b": {"path": "a.txt"}}
    with pytest.raises(StageError, match=r"ingest.sources.a b.\[key\]"):
        parse_params(raw)
    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["hub"] = {"c4": {"dataset": "allenai/c4", "revision": "main"}}
    with pytest.raises(StageError, match=r"hub.c4.revision='main': String should match pattern"):
        parse_params(raw)
    raw["hub"] = {"c4": {"dataset": "allenai/c4", "revision": "0" * 40, "max_documents": 10}}
    with pytest.raises(StageError, match=r"hub.c4: 'max_documents' streams one split: give 'split'"):
        parse_params(raw)
    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["pack"]["repeat"] = {"glue_text": 20}
    with pytest.raises(
        StageError, match=r"pack.repeat.glue_text: no ingest source 'glue_text' \(ingest.sources: sample\)"
    ):
        parse_params(raw)
    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["glue"]["source"] = "hub"
    with pytest.raises(StageError, match=r"glue.source='hub': Input should be 'tsv' or 'disk'"):
        parse_params(raw)


def test_stage_fails_on_bad_params_with_one_line_before_any_work(workdir) -> None:
    workdir.set("sample.documents", 0)
    result = workdir.run("sample")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: params.yaml: sample.documents=0: Input should be greater than or equal to 1"
    ]
    assert not (workdir.path / "data").exists()


def test_invalid_yaml_is_one_line(workdir) -> None:
    (workdir.path / "params.yaml").write_text("seed: [1\n")
    result = workdir.run("pack")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: params.yaml: not valid YAML")


def test_a_model_can_have_its_own_pretrain_values() -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["models"]["decoder_clm"]["pretrain"] = {"max_steps": 300, "lr": 0.002}
    params = parse_params(raw)
    decoder, encoder = params.pretrain_of("decoder_clm"), params.pretrain_of("encoder_mlm")
    assert (decoder.max_steps, decoder.lr) == (300, 0.002)
    assert (encoder.max_steps, encoder.lr) == (raw["pretrain"]["max_steps"], raw["pretrain"]["lr"])
    assert decoder.batch_size == encoder.batch_size
    assert (
        params.models["decoder_clm"].config() == parse_params(DEFAULT_PARAMS).models["decoder_clm"].config()
    )


def test_an_electra_model_trains_at_its_objectives_lr_unless_it_sets_its_own() -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["models"]["electra"] = {"arch": "encoder", "objective": "electra", "preset": "tiny"}
    params = parse_params(raw)
    assert params.pretrain_of("electra").lr == raw["objectives"]["electra"]["lr"] != raw["pretrain"]["lr"]
    assert params.pretrain_key("electra", "lr") == "objectives.electra.lr"
    assert params.pretrain_of("encoder_mlm").lr == raw["pretrain"]["lr"]
    raw["models"]["electra"]["pretrain"] = {"lr": 3e-4}
    params = parse_params(raw)
    assert (params.pretrain_of("electra").lr, params.pretrain_key("electra", "lr")) == (
        3e-4,
        "models.electra.pretrain.lr",
    )
    del raw["models"]["electra"]["pretrain"]
    raw["objectives"]["electra"]["lr"] = None
    params = parse_params(raw)
    assert (params.pretrain_of("electra").lr, params.pretrain_key("electra", "lr")) == (
        raw["pretrain"]["lr"],
        "pretrain.lr",
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"max_stepz": 3}, "models.decoder_clm.pretrain.max_stepz: unknown key"),
        (
            {"max_steps": 0},
            "models.decoder_clm.pretrain.max_steps=0: Input should be greater than or equal to 1",
        ),
        ({"warmup_steps": 10_000}, "models.decoder_clm.pretrain: warmup_steps (10000) must be <= max_steps"),
        ({"models": {}}, "models.decoder_clm.pretrain.models: unknown key"),
        (
            {"seq_len": 4096},
            "models.decoder_clm.max_len (128) is shorter than models.decoder_clm.pretrain.seq_len (4096)",
        ),
    ],
)
def test_bad_pretrain_values_of_a_model_name_the_dotted_key(overrides: dict, expected: str) -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["models"]["decoder_clm"]["pretrain"] = overrides
    with pytest.raises(StageError) as info:
        parse_params(raw)
    assert "\n" not in str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"embedding_size": 512}, "models.encoder_mlm.embedding_size: 512 exceeds d_model (128)"),
        ({"layer_groups": 2}, "models.encoder_mlm.layer_groups: groups of shared layers need share_layers"),
        ({"share_layers": "all", "layer_groups": 3}, "models.encoder_mlm.layer_groups: 3 groups exceed"),
        ({"share_layers": "some"}, "models.encoder_mlm.share_layers='some': Input should be 'none', 'all'"),
    ],
)
def test_bad_albert_options_name_the_dotted_key(changes: dict, expected: str) -> None:
    assert_params_error({"models": {"encoder_mlm": changes}}, expected)


def test_a_model_can_have_its_own_finetune_values() -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["finetune"]["models"] = {"decoder_clm": {"lr": 3.0e-4, "epochs": 2}}
    params = parse_params(raw)
    for task, recipe in raw["finetune"]["tasks"].items():
        own, other = params.recipe_of("decoder_clm", task), params.recipe_of("encoder_mlm", task)
        assert (own.lr, own.epochs) == (3.0e-4, 2)
        assert (other.lr, other.epochs) == (recipe["lr"], recipe["epochs"])
        assert own.max_len == other.max_len == recipe["max_len"]
    assert params.recipe_key("decoder_clm", "sst2", "lr") == "finetune.models.decoder_clm.lr"
    assert params.recipe_key("decoder_clm", "sst2", "max_len") == "finetune.tasks.sst2.max_len"
    assert params.recipe_key("encoder_mlm", "sst2", "lr") == "finetune.tasks.sst2.lr"


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ({"decoder_clm": {"lrr": 3.0e-4}}, "finetune.models.decoder_clm.lrr: unknown key"),
        ({"decoder_clm": {"lr": 0}}, "finetune.models.decoder_clm.lr=0: Input should be greater than 0"),
        (
            {"decoder": {"lr": 3.0e-4}},
            "finetune.models.decoder: no such model; the models are: encoder_mlm, decoder_clm, encdec_span",
        ),
        (
            {"decoder_clm": {"max_len": 4096}},
            "finetune.models.decoder_clm.max_len (4096) is longer than models.decoder_clm.max_len (128)",
        ),
    ],
)
def test_bad_finetune_values_of_a_model_name_the_dotted_key(models: dict, expected: str) -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["finetune"]["models"] = models
    with pytest.raises(StageError) as info:
        parse_params(raw)
    assert "\n" not in str(info.value)
    assert expected in str(info.value)


def test_fsdp_on_the_cpu_is_refused_before_a_run_starts() -> None:
    import copy

    raw = copy.deepcopy(DEFAULT_PARAMS)
    raw["pretrain"].update(strategy="fsdp", devices=2, accelerator="cpu")
    with pytest.raises(StageError, match=r"^params.yaml: pretrain: .*strategy fsdp needs a GPU; use ddp"):
        parse_params(raw)
    raw["pretrain"]["accelerator"] = "gpu"  # valid params on any machine; the stage needs the GPU
    assert parse_params(raw).pretrain.strategy == "fsdp"


def test_the_params_reference_is_generated_from_the_schema() -> None:
    """docs/params.md is the schema's own account of every key (`python -m lmpipe.regenerate`)."""
    from lmpipe.params.reference import DOC, reference

    text = reference()
    assert "| `pretrain.lr` | float | `0.001` | > 0 |" in text
    assert "`models.<name>.preset`" in text and "`finetune.tasks.<name>.epochs`" in text
    stale = "docs/params.md is stale: python -m lmpipe.regenerate"
    assert DOC.read_text(encoding="utf-8") == text, stale


def test_params_yaml_holds_the_schemas_defaults() -> None:
    """One set of defaults: every key the schema has a default for has that value in params.yaml
    (which DVC reads), but for what a profile names rather than defaults (models, task recipes)."""
    from pydantic import BaseModel

    content = {"models", "finetune.tasks", "glue.synthetic"}  # what the offline profile names

    def differences(model: BaseModel, prefix: str) -> Iterator[str]:
        for name, field in type(model).model_fields.items():
            value, key = getattr(model, name), f"{prefix}{name}"
            if isinstance(value, BaseModel):
                yield from differences(value, f"{key}.")
            elif key not in content and not field.is_required():
                default = field.get_default(call_default_factory=True)
                if value != default:
                    yield f"{key}: schema {default!r}, params.yaml {value!r}"

    assert list(differences(load_params(ROOT / "params.yaml"), "")) == []


def test_the_finetune_stage_depends_on_every_key_of_its_section() -> None:
    """dvc.yaml lists `finetune`'s keys one by one (the fine-tunes' own, not `evaluate`'s): a key the
    schema gains must be among them, or a change to it would leave the stage cached (as
    `finetune.method` did, until this test)."""
    import yaml

    from lmpipe.params.finetune import FinetuneParams

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["finetune"]["do"]
    listed = {key for key in stage["params"] if isinstance(key, str)}
    assert {f"finetune.{field}" for field in FinetuneParams.model_fields} <= listed
