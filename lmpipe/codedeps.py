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
from functools import cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "models", "lmpipe")
OUTPUT_NEUTRAL = ("lmpipe.tracking", "lmpipe.codedeps", "lmpipe.params.project")  # see the module's docstring
LOADERS = ("models.implementations", "models.architectures.base")  # see the module's docstring
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
    import stands (but under `if TYPE_CHECKING:`, which never runs)."""
    tree = ast.parse(source, str(path))
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
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "READS_SOURCE_OF" for t in node.targets
        ):
            found.update(ast.literal_eval(node.value))
    return found


@cache
def code_files(module: str) -> tuple[str, ...]:
    """The project files `python -m module` executes, sorted, as paths relative to the root."""
    if module_path(module) is None:
        raise ValueError(f"{module}: not a module of the project's packages ({', '.join(PACKAGES)})")
    sources: dict[Path, str] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        if any(name == neutral or name.startswith(f"{neutral}.") for neutral in OUTPUT_NEUTRAL):
            continue
        for depth in range(1, len(parts) + 1):  # a module's packages run first
            path = module_path(".".join(parts[:depth]))
            if path is not None and path not in sources:
                sources[path] = (ROOT / path).read_text(encoding="utf-8")
                todo.extend(imports(path, sources[path]))
                todo.extend(implementations(".".join(parts[:depth])))
    # an empty __init__.py runs nothing: it joins the closure once it has content
    return tuple(sorted(path.as_posix() for path, source in sources.items() if source.strip()))


def implementations(loader: str) -> list[str]:
    """The implementation modules `loader` may import: every registered declaration's (LOADERS)."""
    if loader not in LOADERS:
        return []
    from models.specs.architectures import ARCHITECTURES
    from models.specs.objectives import OBJECTIVES

    declared = OBJECTIVES if loader == LOADERS[0] else ARCHITECTURES
    return sorted({spec.implementation for spec in declared.values() if spec.implementation})


@cache
def code_digest(module: str) -> str:
    """sha256 of the names and bytes of the files `python -m module` executes: a resumed run's
    results must come from the same code (a fixed bug must not be resumed around). Once per process,
    as `code_files`: the code a process runs does not change under it."""
    digest = hashlib.sha256()
    for source in code_files(module):
        digest.update(source.encode() + b"\0" + (ROOT / source).read_bytes())
    return digest.hexdigest()


def stage_modules(dvc: dict) -> dict[str, str]:
    """Stage (as written in dvc.yaml, before foreach/matrix expansion) -> the module its cmd runs."""
    modules = {}
    for stage, body in dvc.get("stages", {}).items():
        cmd = (body.get("do") or body)["cmd"]
        match = _COMMAND.search(cmd if isinstance(cmd, str) else " ".join(cmd))
        if match and module_path(match.group(1)):
            modules[stage] = match.group(1)
    return modules


def disagreements(dvc_file: Path = ROOT / "dvc.yaml") -> list[str]:
    """One line per code dep that dvc.yaml lacks or lists wrongly; empty when they agree."""
    dvc = yaml.safe_load(dvc_file.read_text(encoding="utf-8"))
    problems = []
    for stage, module in stage_modules(dvc).items():
        body = dvc["stages"][stage]
        declared = {d for d in (body.get("do") or body).get("deps", []) if d.split("/")[0] in PACKAGES}
        expected = set(code_files(module))
        for path in sorted(expected - declared):
            problems.append(f"{dvc_file.name}: stages.{stage}.deps: missing {path} ({module} imports it)")
        for path in sorted(declared - expected):
            problems.append(f"{dvc_file.name}: stages.{stage}.deps: {path} is not imported by {module}")
    return problems


def write(dvc_file: Path = ROOT / "dvc.yaml") -> None:
    """Replace each stage's code deps in dvc.yaml by its closure, first in the list, the rest untouched."""
    modules = stage_modules(yaml.safe_load(dvc_file.read_text(encoding="utf-8")))
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
            out.extend(f"{indent}  - {path}\n" for path in code_files(modules[stage]))
            in_deps = True
    dvc_file.write_text("".join(out), encoding="utf-8")
