"""`python -m lmpipe.regenerate`: what the project derives from its code and registries, written in one
go after an objective, an architecture or a stage is added or changed: dvc.yaml's code deps (each
stage's import closure), params.yaml's `objectives` section for every registered objective it lacks
(the declaration's defaults), and docs/params.md (the schema's reference). `--check` writes nothing and
exits 1 naming each stale file (the suite fails on one)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

import yaml

from lmpipe import codedeps
from lmpipe.params import reference

PARAMS = codedeps.ROOT / "params.yaml"


def params_with_every_objective(text: str) -> str:
    """params.yaml's text with a line for each registered objective that its `objectives` section lacks,
    its declaration's defaults in flow style after the section's last line (the rest as it was)."""
    from models.specs.objectives import OBJECTIVES

    present = (yaml.safe_load(text) or {}).get("objectives") or {}
    missing = [spec for name, spec in OBJECTIVES.items() if name not in present]
    if not missing:
        return text
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.rstrip() == "objectives:")
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " #"):
        end += 1
    while lines[end - 1].strip() == "":  # after the section's last line, before its blank lines
        end -= 1

    def flow(defaults: dict) -> str:
        return yaml.safe_dump(defaults, default_flow_style=True, sort_keys=False, width=10**6).strip()

    added = [f"  {spec.name}: {flow(asdict(spec.Params()))}\n" for spec in missing]
    return "".join([*lines[:end], *added, *lines[end:]])


def stale() -> list[str]:
    """The derived files that differ from what this command would write."""
    found = [f"dvc.yaml: {line}" for line in codedeps.disagreements()]
    text = PARAMS.read_text(encoding="utf-8")
    if params_with_every_objective(text) != text:
        found.append("params.yaml: an objective is registered without its section")
    doc = reference.DOC
    if not doc.exists() or doc.read_text(encoding="utf-8") != reference.reference():
        found.append(f"{doc.relative_to(codedeps.ROOT)}: not the schema's reference")
    return found


def write() -> None:
    codedeps.write()
    text = PARAMS.read_text(encoding="utf-8")
    PARAMS.write_text(params_with_every_objective(text), encoding="utf-8")
    reference.DOC.write_text(reference.reference(), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lmpipe.regenerate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming what is stale")
    if not parser.parse_args(argv).check:
        write()
    problems = stale()
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        sys.exit(1)
    print("dvc.yaml, params.yaml and docs/params.md are as the code and its registries say")


if __name__ == "__main__":
    main()
