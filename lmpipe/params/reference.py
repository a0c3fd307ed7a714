"""docs/params.md, generated from the schema: every key of params.yaml with its type, its default and
its rules, so that the reference cannot drift from what the stages accept. `python -m
lmpipe.regenerate` rewrites it; the suite fails when it is stale."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from lmpipe.data.quality import RULES
from lmpipe.params.pretrain import objectives_params
from lmpipe.params.project import Params
from lmpipe.params.schema import read_params_yaml

ROOT = Path(__file__).resolve().parents[2]
DOC, PARAMS_YAML = ROOT / "docs/params.md", ROOT / "params.yaml"
HEADER = """# params.yaml reference

Generated from the schema (`lmpipe/params/`) by `python -m lmpipe.regenerate`; the suite fails
when this file is stale. Defaults are the schema's: the project's `params.yaml` sets the offline default
profile on top of them, and `flows/profiles/*.yaml` other profiles. An unknown key, a wrong type or a
value outside the rules stops a stage before any work, with one line naming the dotted key.
"""
_RULES = {
    annotated_types.Ge: ("≥", "ge"),
    annotated_types.Gt: (">", "gt"),
    annotated_types.Le: ("≤", "le"),
    annotated_types.Lt: ("<", "lt"),
}


def type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(repr(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join("null" if arg is type(None) else type_name(arg) for arg in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"mapping {type_name(args[0])} → {type_name(args[1])}"
    return getattr(annotation, "__name__", str(annotation))


def rules(field: FieldInfo) -> str:
    found = []
    for item in field.metadata:
        for kind, (sign, attribute) in _RULES.items():
            if isinstance(item, kind):
                found.append(f"{sign} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            unit = "character" if field.annotation is str else "item"
            found.append(f"at least {item.min_length} {unit}{'s' if item.min_length > 1 else ''}")
        if getattr(item, "pattern", None):
            found.append(f"matches `{item.pattern}`".replace("|", "\\|"))
    return ", ".join(found)


def default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default if field.default is not PydanticUndefined else field.default_factory()
    if isinstance(value, BaseModel):
        return ""
    return (
        f"`{yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix('...').strip()}`"
    )


def model_of(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """The section (or sub-section) model a field holds, and the key suffix that reaches it."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return "", annotation
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        if inspect.isclass(value) and issubclass(value, BaseModel):
            return ".<name>", value
    return None


def row(key: str, field: FieldInfo) -> str:
    cells = [f"`{key}`", type_name(field.annotation), default(field), rules(field), field.description or ""]
    return "| " + " | ".join(cells) + " |"


def rows(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, field in model.model_fields.items():
        nested = model_of(field.annotation)
        if nested is None:
            yield row(f"{prefix}{name}", field)
        else:
            suffix, section = nested
            yield from rows(section, f"{prefix}{name}{suffix}.")


def reference() -> str:
    parts = [HEADER]
    table = "\n| key | type | default | rules | meaning |\n|---|---|---|---|---|\n"
    fields = Params.model_fields
    written = read_params_yaml(PARAMS_YAML) or {}  # the sections in the order params.yaml has them
    for name in sorted(fields, key=lambda key: list(written).index(key) if key in written else len(written)):
        field = fields[name]
        parts.append(f"\n## `{name}`\n")
        # the objectives' sections are the registered objectives' own params classes
        nested = ("", type(objectives_params())) if name == "objectives" else model_of(field.annotation)
        if nested is None:
            parts.append(table + row(name, field) + "\n")
            continue
        suffix, section = nested
        if section.__doc__:  # the section's own docstring, not one inherited
            parts.append("\n" + " ".join(inspect.getdoc(section).split()) + "\n")
        parts.append(table + "\n".join(rows(section, f"{name}{suffix}.")) + "\n")
        if name == "clean":
            parts.append(quality_rules())
    return "".join(parts)


def quality_rules() -> str:
    """The rules of `clean`, from their one list (lmpipe/data/quality.py RULES)."""
    lines = [
        "\nThe quality rules, in the order they are tried: a dropped document is counted in",
        "`metrics/clean.json` against the first rule it breaks.\n",
        "| rule | params | drops |",
        "|---|---|---|",
    ]
    for rule in RULES:
        keys = ", ".join(f"`clean.{key}`" for key in rule.params)
        lines.append(f"| `{rule.name}` | {keys} | {rule.drops} |")
    return "\n".join(lines) + "\n"
