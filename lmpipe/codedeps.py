"""The code of a stage: the project modules in the import closure of the module its `cmd` runs.

dvc.yaml declares exactly these files as each stage's code deps, so that a change to any module a
stage runs makes that stage stale and a change to anything else (tests, docs, other stages' modules)
does not. `disagreements` lists where dvc.yaml and the closure disagree (the test suite fails on
any), `write` puts the closure into dvc.yaml (`python -m lmpipe.regenerate` runs it), and pretrain's
resume fingerprint hashes the same files.

Every import counts, also one inside a function (it runs when the stage does); an imported package
brings its `__init__.py` once that has any content (an empty one runs nothing). A module whose stage
reads other modules' source (the export writes models/ as remote code) names them in a module-level
`READS_SOURCE_OF = ("models.x", ...)`: they count as imported. Modules outside the project's packages
are the environment's business.

`models/implementations.py` (the objectives') and `models/architectures/base.py` (the architectures')
load each declaration's implementation by the module name the declaration gives (models/specs): every
registered implementation counts as imported by its loader.

Three modules every stage imports cannot change what a stage writes, so they and their imports are
left out of the closures (an edit to them re-runs nothing): `lmpipe.tracking`, which logs to MLflow
and returns nothing a stage writes (run ids and the experiment's name go to MLflow only: the same
params give the same output bytes against any MLflow store, which the tests compare);
`lmpipe.params.project`, the whole-file check that can stop a stage but hands it nothing (the stage
reads its own sections through their own modules); and this module, which only decides what an
interrupted run may reuse.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import yaml

from lmpipe.layout import CODE_DIGESTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "models", "lmpipe")
OUTPUT_NEUTRAL = ("lmpipe.tracking", "lmpipe.codedeps", "lmpipe.params.project")  # see the module's docstring
LOADERS = ("models.implementations", "models.architectures.base")  # see the module's docstring
# code.yaml's digests tell DVC that code changed, nothing more: 64 bits are plenty, and they keep the
# columns `dvc exp show` prints for them narrow
DIGITS = 16
CODE_STAGE = "stages.code"  # writes each model's own code (`digests`) to layout.CODE_DIGESTS
REGISTRIES = ("models.specs.objectives", "models.specs.architectures")  # the declarations' imports
_COMMAND = re.compile(r"\bpython -m ([\w.]+)")


def module_path(module: str) -> Path | None:
    """The file (relative to the project root) that `import module` executes, if it is the project's."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    base = Path(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if (ROOT / candidate).is_file():
            return candidate
    return None


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): a block only type checkers read."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING"


def imports(path: Path, source: str) -> set[str]:
    """Every module `source`, the file at `path` (relative to the root), may import, wherever the
    import stands (but under `if TYPE_CHECKING:`, which never runs), and those it reads as source."""
    tree = ast.parse(source, str(path))
    return _imports(path, tree) | _source_reads(tree)


def _imports(path: Path, tree: ast.Module) -> set[str]:
    package = ".".join(path.parent.parts)
    found: set[str] = set()
    for node in ast.walk(tree):
        if _type_checking_only(node):
            node.body = []  # never runs: imports for annotations only
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package upwards
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from models import heads`
    return found


def _source_reads(tree: ast.Module) -> set[str]:
    """The modules a file names in `READS_SOURCE_OF`: it reads them whole, every registered unit included."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "READS_SOURCE_OF" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


@cache
def _parsed(path: Path) -> tuple[bool, frozenset[str], frozenset[str]]:
    """A project file, read and parsed once a process: (whether it has content, what it may import,
    what it reads as source). The closures of every stage and unit share it."""
    source = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(source, str(path))
    reads = _source_reads(tree)
    return bool(source.strip()), frozenset(_imports(path, tree) | reads), frozenset(reads)


def neutral_to(module: str) -> tuple[str, ...]:
    """OUTPUT_NEUTRAL, but for the stage that writes the code digests with this module's functions."""
    return tuple(name for name in OUTPUT_NEUTRAL if module != CODE_STAGE or name != "lmpipe.codedeps")


@cache
def _closure(module: str, split: bool) -> tuple[str, ...]:
    """The project files `python -m module` executes, sorted, relative to the root. `split`: without the
    units (`units()`) the module reaches only through a registry or a loader, the code each model of a
    stage over `models` runs for its own objective and architecture; a unit's module reached another
    way (imported directly, read as source) counts as the module's own."""
    if module_path(module) is None:
        raise ValueError(f"{module}: not a module of the project's packages ({', '.join(PACKAGES)})")
    unit_modules = {name for modules in units().values() for name in modules} if split else set()
    reached_files: set[Path] = set()
    whole_read: set[Path] = set()
    todo = [(module, False)]  # (module, reached through a READS_SOURCE_OF: its units all count)
    while todo:
        name, whole = todo.pop()
        parts = name.split(".")
        if any(name == neutral or name.startswith(f"{neutral}.") for neutral in neutral_to(module)):
            continue
        for depth in range(1, len(parts) + 1):  # a module's packages run first
            package = ".".join(parts[:depth])
            path = module_path(package)
            if path is None or (path in reached_files and (path in whole_read or not whole)):
                continue
            reached_files.add(path)
            if whole:
                whole_read.add(path)
            _, imported, reads = _parsed(path)
            reached = imported | set(implementations(package))
            if not whole and package in REGISTRIES + LOADERS:
                reached -= unit_modules
            todo.extend((target, whole or target in reads) for target in reached)
    # an empty __init__.py runs nothing: it joins the closure once it has content
    return tuple(sorted(path.as_posix() for path in reached_files if _parsed(path)[0]))


def code_files(module: str) -> tuple[str, ...]:
    """The project files `python -m module` executes, sorted, as paths relative to the root."""
    return _closure(module, split=False)


def implementations(loader: str) -> list[str]:
    """The implementation modules `loader` may import: every registered declaration's (LOADERS)."""
    if loader not in LOADERS:
        return []
    from models.specs.architectures import ARCHITECTURES
    from models.specs.objectives import OBJECTIVES

    declared = OBJECTIVES if loader == LOADERS[0] else ARCHITECTURES
    return sorted({spec.implementation for spec in declared.values() if spec.implementation})


@cache
def units() -> dict[tuple[str, str], tuple[str, ...]]:
    """(`objectives` | `architectures`, name) -> the modules of that registered unit: its declaration's
    and its implementation's. A mixture (no implementation of its own) runs the objectives its params
    name, any registered one: all of them count."""
    from models.specs.architectures import ARCHITECTURES
    from models.specs.objectives import OBJECTIVES

    every_objective = [type(spec).__module__ for spec in OBJECTIVES.values()] + implementations(LOADERS[0])
    found = {}
    for kind, registry in (("objectives", OBJECTIVES), ("architectures", ARCHITECTURES)):
        for name, spec in registry.items():
            own = [type(spec).__module__, spec.implementation] if spec.implementation else every_objective
            found[(kind, name)] = tuple(dict.fromkeys(own))
    return found


def unit_files(module: str, unit: tuple[str, str]) -> tuple[str, ...]:
    """The files `python -m module` executes for a model of that unit beyond its own split closure."""
    everything, shared = set(_closure(module, split=False)), set(_closure(module, split=True))
    reached = [
        name for name in units()[unit] if (path := module_path(name)) and path.as_posix() in everything
    ]
    own = {path for name in reached for path in _closure(name, split=True)}
    return tuple(sorted(own - shared))


def _digest(files: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for source in files:
        digest.update(source.encode() + b"\0" + (ROOT / source).read_bytes())
    return digest.hexdigest()


@cache
def code_digest(module: str, objective: str | None = None, arch: str | None = None) -> str:
    """sha256 of the names and bytes of the files `python -m module` executes (for one model, with
    `objective` and `arch`: its stage's own files and its units'): a resumed run's results must come
    from the same code (a fixed bug must not be resumed around). Once per process, as the closures: the
    code a process runs does not change under it."""
    if objective is None:
        return _digest(code_files(module))
    files = {*_closure(module, split=True)}
    files |= {*unit_files(module, ("objectives", objective)), *unit_files(module, ("architectures", arch))}
    return _digest(sorted(files))


def stage_modules(dvc: dict) -> dict[str, str]:
    """Stage (as written in dvc.yaml, before foreach/matrix expansion) -> the module its cmd runs."""
    modules = {}
    for stage, body in dvc.get("stages", {}).items():
        cmd = (body.get("do") or body)["cmd"]
        match = _COMMAND.search(cmd if isinstance(cmd, str) else " ".join(cmd))
        if match and module_path(match.group(1)):
            modules[stage] = match.group(1)
    return modules


MODEL_GROUPS = ("${models}", "${distill.students}")  # a student is a model: the stages over both


def model_stages(dvc: dict) -> dict[str, str]:
    """The stages over `models` or `distill.students` (`foreach: ${models}`, ...) -> their modules: each
    model's own code is read from its units' digests (`digests`), the rest from the stage's split
    closure."""
    return {
        stage: module
        for stage, module in stage_modules(dvc).items()
        if dvc["stages"][stage].get("foreach") in MODEL_GROUPS
    }


def digest_key(module: str) -> str:
    """code.yaml's section of a stage over models: its module's name in `stages` (the groups over models
    and over students that run one module read the same digests)."""
    return module.removeprefix("stages.")


def unit_params(module: str) -> dict[str, list[str]]:
    """What a stage over `models` that runs `module` lists under `params:` to depend on its model's own
    code."""
    key = digest_key(module)
    return {
        str(CODE_DIGESTS): [
            f"{key}.objectives.${{item.objective}}",
            f"{key}.architectures.${{item.arch}}",
        ]
    }


def digests(stages: Iterable[str]) -> dict[str, dict[str, dict[str, str]]]:
    """Stage over `models` (its module `stages.<stage>`) -> `objectives` | `architectures` -> name ->
    the sha256 of the files that unit adds to the stage's own code, its first DIGITS hex digits (what
    `python -m stages.code` writes to code.yaml)."""
    found: dict[str, dict[str, dict[str, str]]] = {}
    for stage in stages:
        for kind, name in units():
            files = unit_files(f"stages.{stage}", (kind, name))
            found.setdefault(stage, {}).setdefault(kind, {})[name] = _digest(files)[:DIGITS]
    return found


def code_command(dvc: dict) -> str:
    """The `code` stage's command: the modules of the stages over `models` it writes digests for (as
    arguments, so that DVC re-runs it when they change: dvc.yaml cannot be a dependency)."""
    keys = dict.fromkeys(digest_key(module) for module in model_stages(dvc).values())
    return " ".join(["python -m", CODE_STAGE, *keys])


def disagreements(dvc_file: Path = ROOT / "dvc.yaml") -> list[str]:
    """One line per code dep that dvc.yaml lacks or lists wrongly; empty when they agree."""
    dvc = yaml.safe_load(dvc_file.read_text(encoding="utf-8"))
    problems = []
    for stage, module in stage_modules(dvc).items():
        body = dvc["stages"][stage]
        declared = {d for d in (body.get("do") or body).get("deps", []) if d.split("/")[0] in PACKAGES}
        expected = set(_closure(module, split=stage in model_stages(dvc)))
        for path in sorted(expected - declared):
            problems.append(f"{dvc_file.name}: stages.{stage}.deps: missing {path} ({module} imports it)")
        for path in sorted(declared - expected):
            problems.append(f"{dvc_file.name}: stages.{stage}.deps: {path} is not imported by {module}")
    for stage, module in model_stages(dvc).items():
        if not module.startswith("stages."):
            problems.append(
                f"{dvc_file.name}: stages.{stage}.cmd: a stage over models runs a module of stages"
            )
        wanted = unit_params(module)
        if wanted not in dvc["stages"][stage]["do"].get("params", []):
            problems.append(
                f"{dvc_file.name}: stages.{stage}.params: missing {wanted} (its model's own code)"
            )
    code = next((stage for stage, module in stage_modules(dvc).items() if module == CODE_STAGE), None)
    if code is not None and dvc["stages"][code]["cmd"] != code_command(dvc):
        problems.append(f"{dvc_file.name}: the code stage's cmd is not `{code_command(dvc)}`")
    return problems


def write(dvc_file: Path = ROOT / "dvc.yaml") -> None:
    """Replace each stage's code deps in dvc.yaml by its closure, first in the list, the rest untouched."""
    dvc = yaml.safe_load(dvc_file.read_text(encoding="utf-8"))
    modules, split = stage_modules(dvc), model_stages(dvc)
    out: list[str] = []
    stage, in_deps = None, False
    for line in dvc_file.read_text(encoding="utf-8").splitlines(keepends=True):
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if len(indent) == 2 and stripped.endswith(":"):
            stage = stripped[:-1]
        if in_deps and stripped.startswith("- ") and stripped[2:].split("/")[0] in PACKAGES:
            continue
        in_deps = in_deps and stripped.startswith("- ")
        out.append(line)
        if stripped == "deps:" and stage in modules:
            out.extend(f"{indent}  - {path}\n" for path in _closure(modules[stage], split=stage in split))
            in_deps = True
    dvc_file.write_text("".join(out), encoding="utf-8")
