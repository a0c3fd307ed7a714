"""dvc.yaml's code deps are the import closure of each stage's module, in both directions, and DVC
therefore re-runs exactly the stages a code change affects; the output paths dvc.yaml declares are
the ones lmpipe.layout names."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
import yaml

from lmpipe import layout
from lmpipe.codedeps import (
    PACKAGES,
    ROOT,
    code_files,
    digest_key,
    disagreements,
    imports,
    model_stages,
    unit_files,
    units,
    write,
)
from tests.project import changed_deps, copy_project, dvc_stages

DVC_YAML = yaml.safe_load((ROOT / "dvc.yaml").read_text())


def test_dvc_yaml_declares_exactly_the_import_closure_of_every_stage() -> None:
    assert disagreements() == []


def test_the_closure_follows_every_import_and_nothing_else() -> None:
    finetune = code_files("stages.finetune")
    assert "models/heads.py" in finetune  # imported inside main(): it runs when the stage does
    assert {"lmpipe/runtime.py", "models/transformer.py"} <= set(finetune)
    assert "models/pretraining.py" not in finetune
    pretrain = code_files("stages.pretrain")
    assert "models/pretraining.py" in pretrain and "models/heads.py" not in pretrain
    assert not any(path.startswith(("tests/", "flows/")) for path in code_files("stages.evaluate"))
    with pytest.raises(ValueError, match="not a module of the project"):
        code_files("numpy")


@pytest.mark.parametrize(
    ("stage", "remove", "add", "expected"),
    [
        (
            "tokenizer",
            "lmpipe/data/splitting.py",
            None,
            "stages.tokenizer.deps: missing lmpipe/data/splitting.py",
        ),
        ("evaluate", None, "stages/finetune.py", "stages.evaluate.deps: stages/finetune.py is not imported"),
        ("pretrain", "models/pretraining.py", None, "stages.pretrain.deps: missing models/pretraining.py"),
    ],
)
def test_a_missing_or_extra_code_dep_is_reported(
    tmp_path: Path, stage: str, remove: str | None, add: str | None, expected: str
) -> None:
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    body = dvc["stages"][stage].get("do") or dvc["stages"][stage]
    body["deps"] = [d for d in body["deps"] if d != remove] + ([add] if add else [])
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False))
    problems = disagreements(tmp_path / "dvc.yaml")
    assert len(problems) == 1 and expected in problems[0], problems


def test_write_puts_the_closure_back_and_keeps_the_rest(tmp_path: Path) -> None:
    text = (ROOT / "dvc.yaml").read_text()
    evaluate_deps = "      - data/glue\n      - data/finetune\n"
    broken = text.replace("      - lmpipe/data/readers.py\n", "", 1).replace(
        evaluate_deps, evaluate_deps + "      - models/heads.py\n"
    )
    assert broken != text
    (tmp_path / "dvc.yaml").write_text(broken)
    write(tmp_path / "dvc.yaml")
    assert (tmp_path / "dvc.yaml").read_text() == text


def test_dvc_yaml_declares_the_outputs_that_stages_layout_names() -> None:
    def declared(stage: str, kind: str) -> list[str]:
        body = DVC_YAML["stages"][stage].get("do") or DVC_YAML["stages"][stage]
        return [next(iter(o)) if isinstance(o, dict) else o for o in body.get(kind, [])]

    model = "${key}"
    assert declared("sample", "outs") == [str(layout.SAMPLE)]
    assert declared("hub", "outs") == [str(layout.hub_dir(model))]
    assert declared("hub", "metrics") == [str(layout.hub_metrics(model))]
    assert declared("ingest", "outs") == [str(layout.raw_dir(model))]
    assert declared("ingest", "metrics") == [str(layout.ingest_metrics(model))]
    assert str(layout.RAW) in declared("clean", "deps")
    assert declared("clean", "outs") == [str(layout.CLEAN)]
    assert declared("clean", "metrics") == [str(layout.CLEAN_METRICS)]
    assert declared("tokenizer", "outs") == [str(layout.TOKENIZER)]
    assert declared("pack", "outs") == [str(layout.TOKENS)]
    assert declared("glue_prepare", "outs") == [str(layout.GLUE)]
    assert declared("pretrain", "outs") == [str(layout.final_checkpoint(model))]
    assert declared("pretrain", "metrics") == [str(layout.pretrain_metrics(model))]
    assert declared("pretrain", "plots") == [
        str(layout.pretrain_curve(model)),
        str(layout.pretrain_context(model)),
    ]
    assert declared("finetune", "outs") == [str(layout.finetune_out(model))]
    assert layout.finetune_stage("m") == "finetune@m"
    reports = [layout.GLUE_REPORT, layout.GLUE_TABLE, layout.GLUE_CHART]
    assert declared("evaluate", "outs") == [str(layout.PREDICTIONS.parent), *map(str, reports)]
    assert declared("evaluate", "metrics") == [str(layout.GLUE_METRICS)]
    assert declared("evaluate", "plots") == [str(layout.GLUE_PLOT)]


def stale_stages(project: Path) -> set[str]:
    """The stages `dvc status` reports with a modified dependency (outputs are all in place)."""
    stale = changed_deps(project)
    return {stage.split(":")[-1] for stage, deps in stale.items() if "modified" in deps.values()}


@pytest.fixture(scope="module")
def reproduced(reproduced_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CI-sized graph, reproduced, with the README and a test file beside the code."""
    project = copy_project(reproduced_template, tmp_path_factory.mktemp("codedeps") / "project")
    assert stale_stages(project) == set()
    return project


# what an edit to each file of the library may make stale: its own concern's stages, and no other
SHAPE = {
    "lmpipe/data/synthetic.py": {"sample"},
    "lmpipe/data/hub.py": {"hub"},
    "lmpipe/data/ingesting.py": {"ingest"},
    "lmpipe/data/cleaning.py": {"clean"},
    "lmpipe/data/tokenizer.py": {"tokenizer"},
    "lmpipe/data/packing.py": {"pack"},
    "lmpipe/glue/prepare.py": {"glue_prepare"},
    "lmpipe/pretraining.py": {"pretrain"},
    "lmpipe/finetuning.py": {"finetune"},
    "lmpipe/report/glue.py": {"evaluate"},
    "models/export.py": {"export"},
    "lmpipe/data/readers.py": {"ingest"},
    "lmpipe/data/wikiextractor.py": {"ingest"},
    "lmpipe/data/gutenberg.py": {"ingest"},
    "lmpipe/data/splitting.py": {"ingest", "tokenizer"},  # documents cut to a maximum
    "lmpipe/data/quality.py": {"clean"},
    "lmpipe/data/dedup.py": {"clean"},
    "lmpipe/data/parallel.py": {"ingest", "clean", "pack"},  # the shards of the data stages
    "lmpipe/data/shards.py": {"clean", "pack"},
    "lmpipe/data/store.py": {"ingest", "clean", "pack"},
    "lmpipe/data/draws.py": {"tokenizer", "pack"},
    "lmpipe/schemas.py": {"ingest", "clean", "glue_prepare"},  # the tables they validate
    "lmpipe/glue/tasks.py": {"ingest", "glue_prepare", "finetune", "evaluate"},
    "lmpipe/glue/metrics.py": {"evaluate"},
    "lmpipe/report/significance.py": {"evaluate"},
    "lmpipe/tracking.py": set(),  # output-neutral (lmpipe/codedeps.py says why)
    "lmpipe/codedeps.py": {"code"},  # output-neutral to all but the stage that writes code.yaml with it
    "lmpipe/params/sample.py": {"sample"},
    "lmpipe/params/ingest.py": {"ingest", "clean"},  # clean reads the sources' folders
    "lmpipe/params/clean.py": {"clean"},
    "lmpipe/params/tokenizer.py": {"tokenizer"},
    "lmpipe/params/pack.py": {"pack"},
    "lmpipe/params/project.py": set(),  # the whole-file check: output-neutral
    "lmpipe/params/glue.py": {"glue_prepare", "finetune", "evaluate"},
    "lmpipe/params/finetune.py": {"finetune", "evaluate"},
    "lmpipe/params/pretrain.py": {"pretrain"},
    # a student is a model: every stage that reads `models` reads the students' section too
    "lmpipe/params/distill.py": {"pretrain", "export", "finetune", "evaluate"},
    # a student's run (stage distill@, in the graph once distill.students names one)
    "lmpipe/distillation.py": {"distill"},
    "models/distillation.py": {"distill"},
    "lmpipe/params/schema.py": {
        "sample",
        "ingest",
        "clean",
        "tokenizer",
        "pack",
        "glue_prepare",
        "pretrain",
        "export",
        "finetune",
        "evaluate",
    },  # all but code, which reads no params
    # the declarations' registries and bases: every stage that validates `models` asks them which
    # architectures and objectives there are and which pairs fit; the code stage hashes every unit
    **{
        f"models/{module}.py": {"pretrain", "export", "finetune", "evaluate", "code"}
        for module in (
            "specs/__init__",
            "specs/objectives/__init__",
            "specs/objectives/base",
            "specs/architectures/__init__",
            "specs/architectures/base",
            "pair",
        )
    },
    # one objective's or architecture's declaration: evaluate (it validates every model) and the code
    # stage, whose code.yaml then re-runs that unit's models only (MODELS_ONLY); every export writes
    # all the architectures as remote code
    **{
        f"models/specs/objectives/{module}.py": {"evaluate", "code"}
        for module in ("mlm", "clm", "lm", "span", "mixture")
    },
    **{
        f"models/specs/architectures/{module}.py": {"evaluate", "code", "export"}
        for module in ("encoder", "decoder", "prefix_lm", "encoder_decoder")
    },
    # the implementations: an objective's is its models' pretraining alone; an architecture's builds
    # its models (what trains and fine-tunes them), and every export writes all of them as remote code
    **{f"models/objectives/{module}.py": {"code", "pretrain"} for module in ("__init__", "base")},
    **{
        f"models/objectives/{module}.py": {"code"}
        for module in ("mlm", "clm", "lm", "span", "electra", "noise")
    },
    **{
        f"models/architectures/{module}.py": {"code", "pretrain", "export", "finetune"}
        for module in ("__init__", "base")
    },
    **{
        f"models/architectures/{module}.py": {"code", "export"}
        for module in ("encoder", "decoder", "prefix_lm", "encoder_decoder")
    },
    "models/pretraining.py": {"pretrain"},
    "models/flops.py": {"pretrain"},
    "models/implementations.py": {"pretrain", "code"},  # the objectives' loader
    "models/pieces.py": {"pretrain"},  # the piece tables the objectives read
    "models/training.py": {"pretrain", "finetune", "code"},  # the seeds of batches and fine-tunes
    "models/finetuning.py": {"finetune"},
    "models/finetune_data.py": {"finetune"},
    "models/finetune_methods.py": {"finetune"},
    "models/peft_export.py": {"finetune"},  # a LoRA fine-tune's adapter for peft
    "models/hf_classes.py": {"export", "finetune"},  # the export's class, which names the adapter's modules
    "models/heads.py": {"finetune"},
    "models/hf.py": {"export"},
    "models/hf_remote.py": {"export"},  # read as source (the remote code), not imported
    "README.md": set(),
    "tests/test_codedeps.py": set(),
}
# what an edit to a unit's own file re-runs through code.yaml, for that unit's models only
MODELS_ONLY = {
    **{
        path: {"pretrain", "export", "finetune"}
        for path, stages in SHAPE.items()
        if path.startswith("models/specs/objectives/") and stages == {"evaluate", "code"}
    },
    **{
        path: {"pretrain", "finetune"}
        for path, stages in SHAPE.items()
        if path.startswith("models/specs/architectures/") and stages == {"evaluate", "code", "export"}
    },
    **{
        path: {"pretrain"}
        for path, stages in SHAPE.items()
        if path.startswith("models/objectives/") and stages == {"code"}
    },
    **{
        path: {"pretrain", "finetune"}
        for path, stages in SHAPE.items()
        if path.startswith("models/architectures/") and stages == {"code", "export"}
    },
}
# a student's distillation runs the pretraining's code for its own objective and architecture
MODELS_ONLY = {
    path: stages | {"distill"} if "pretrain" in stages else stages for path, stages in MODELS_ONLY.items()
}
STAGE_OF_MODULE = "stages/"  # a stage's own module makes only that stage stale
INFRASTRUCTURE = ("lmpipe/runtime.py", "lmpipe/layout.py")  # every stage


def edit_table(project: Path) -> dict[str, set[str]]:
    """Edited file -> the stages (by name, before `@`) that `dvc status` then reports stale, for every
    file of the code packages: all edited at once, each stage's changed deps read from one status."""
    files = [p for package in PACKAGES for p in sorted((project / package).rglob("*.py")) if p.stat().st_size]
    files += [project / "README.md", project / "tests/test_codedeps.py"]
    originals = {path: path.read_text() for path in files}
    for path, text in originals.items():
        path.write_text(text + "\n# changed\n")
    try:
        changed = changed_deps(project)
    finally:
        for path, text in originals.items():
            path.write_text(text)
    table: dict[str, set[str]] = {path.relative_to(project).as_posix(): set() for path in files}
    for stage, deps in changed.items():
        for dep, how in deps.items():
            if how == "modified" and dep in table:
                table[dep].add(stage.split(":")[-1].split("@")[0])
    return table


def through_code(path: str) -> set[str]:
    """The modules of the stages over `models` (and over students) whose code.yaml keys an edit to
    `path` changes: re-run for the models of the objectives and architectures it is the code of
    (tests/test_new_model_code.py runs it)."""
    modules = set(model_stages(DVC_YAML).values())
    return {digest_key(module) for module in modules for unit in units() if path in unit_files(module, unit)}


def markdown(table: dict[str, set[str]]) -> str:
    """The table by file, a folder's row (`models/objectives/*.py`) standing for more than half of its
    modules (a new objective's adds no row) and the others' own rows listed beside it."""
    folders: dict[Path, dict[str, tuple[frozenset[str], frozenset[str]]]] = {}
    for path, stages in table.items():
        row = (frozenset(stages), frozenset(through_code(path)))
        folders.setdefault(Path(path).parent, {})[path] = row
    rows = {}
    for folder, files in folders.items():
        common, count = Counter(files.values()).most_common(1)[0]
        if count * 2 > len(files) and count > 1 and all(path.endswith(".py") for path in files):
            rows[f"{folder}/*.py"] = common  # a new module of the folder has this row
            files = {path: row for path, row in files.items() if row != common}
        rows |= files
    lines = [
        f"| `{path}` | {', '.join(sorted(stages)) or '(none)'} | {', '.join(sorted(models)) or ' '} |"
        for path, (stages, models) in sorted(rows.items())
    ]
    header = "| edited file | stages `dvc status` reports stale | then, for its models only (code.yaml) |"
    return "\n".join([header, "|---|---|---|", *lines]) + "\n"


def test_an_edit_makes_stale_only_the_stages_of_its_concern(reproduced: Path) -> None:
    """The table of docs/development.md, measured: every file of the code packages edited, and which
    stages DVC then re-runs."""
    table = edit_table(reproduced)
    graph = {name.split("@")[0] for name in dvc_stages(reproduced)}
    assert stale_stages(reproduced) == set()
    for path, stages in table.items():
        if path in SHAPE:
            assert stages == SHAPE[path] & graph, path
            assert through_code(path) == MODELS_ONLY.get(path, set()), path
        elif path.startswith(STAGE_OF_MODULE) and path != "stages/__init__.py":
            own = Path(path).stem
            assert stages == {own} & graph, path
        elif path in INFRASTRUCTURE:
            assert stages == graph, path
    documented = (ROOT / "docs/development.md").read_text()
    assert markdown(table) in documented, "docs/development.md: the code-deps table is not the measured one"


def test_nothing_imports_a_stage_but_to_run_it() -> None:
    """stages/ holds entry points only: the library, the models and the flows never import a stage,
    and a test or benchmark imports one only to call its `main`."""
    offences = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in ("stages", ".venv") or not relative.parts[0].isidentifier():
            continue
        tree = ast.parse(path.read_text())
        # every use of a name: as `name.main` (running the stage) or anything else
        mains = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "main"}
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stages."):
                offences.append(f"{relative}:{node.lineno}: from {node.module} import …")
            elif isinstance(node, ast.ImportFrom) and node.module == "stages":
                if relative.parts[0] in ("lmpipe", "models", "flows"):
                    offences.append(f"{relative}:{node.lineno}: imports a stage")
                for alias in node.names:
                    name = alias.asname or alias.name
                    other = [n.lineno for n in uses if n.id == name and id(n) not in mains]
                    if other:
                        offences.append(f"{relative}:{other[0]}: uses {name} other than {name}.main")
    assert offences == []


def test_every_stage_main_is_short() -> None:
    """A stage's `main` reads its params, calls the library and writes: 60 lines at most (the stage's
    work is in lmpipe/ or models/, where the tests and the flows reach it)."""
    lengths = {}
    for path in sorted((ROOT / "stages").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "main":
                lengths[path.name] = node.end_lineno - node.lineno + 1
    assert len(lengths) >= 10 and max(lengths.values()) <= 60, lengths


def test_the_layers_import_only_downwards() -> None:
    """models/ is the layer the library builds on: it imports nothing of lmpipe/, stages/ or flows/;
    stages/ never imports flows/ (docs/development.md, "Where things are")."""
    above = {"models": ("lmpipe", "stages", "flows"), "stages": ("flows",)}
    offences = [
        f"{path.relative_to(ROOT)}: imports {name}"
        for layer, forbidden in above.items()
        for path in sorted((ROOT / layer).rglob("*.py"))
        for name in sorted(imports(path.relative_to(ROOT), path.read_text()))
        if name.split(".")[0] in forbidden
    ]
    assert offences == []


def test_a_model_s_own_finetune_values_leave_the_pretraining_cached(reproduced: Path) -> None:
    """`finetune.models.<name>` (a model's own fine-tuning lr, say) re-runs fine-tunes, never a
    pretraining."""
    params = reproduced / "params.yaml"
    original = params.read_text()
    raw = yaml.safe_load(original)
    raw["finetune"]["models"] = {next(iter(raw["models"])): {"lr": 3.0e-4}}
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        changed = changed_deps(reproduced)
    finally:
        params.write_text(original)
    stale = {stage.split(":")[-1] for stage, deps in changed.items() if deps}
    expected = {name for name in dvc_stages(reproduced) if name.split("@")[0] == "finetune"}
    assert stale == expected and expected
    assert all(deps == {"params.yaml": {"finetune.models": "modified"}} for deps in changed.values())
