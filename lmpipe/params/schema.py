"""What every section of `params.yaml` shares: strict sections, one-line errors, and loading.

A stage reads the sections it depends on (the same ones dvc.yaml lists as its params) through a
`Sections` class of its own: an unknown key, a wrong type or an out-of-range value in them stops the
stage before any work, with one line naming the dotted key, the value and what is allowed. The flows
validate the whole file (`lmpipe.params.project.Params`).
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from lmpipe.runtime import StageError

PARAMS_FILE = Path("params.yaml")

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
SourceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")]


class Strict(BaseModel):
    """A section, or a part of one: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Sections(BaseModel):
    """The sections of params.yaml one stage reads, each strict; the other sections are not its
    business (and not its dependencies)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    seed: Seed = 1234


def _input_path(path: str) -> str:
    """A file or folder a stage reads: DVC hashes it (a dep in dvc.yaml), so it must be a real path,
    and one outside the project must be absolute (`dvc exp run --temp` runs in another folder)."""
    if glob.has_magic(path):
        raise ValueError(
            f"'{path}' is a pattern: give the folder as 'path' and the pattern as 'include' "
            "(DVC hashes the folder)"
        )
    if not Path(path).is_absolute() and ".." in Path(path).parts:
        raise ValueError(f"'{path}' leaves the project: give a folder outside it as an absolute path")
    return path


InputPath = Annotated[str, Field(min_length=1), AfterValidator(_input_path)]


def _describe(error: dict[str, Any]) -> str:
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
    key = key.removeprefix(".")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{key}: unknown key"
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    if isinstance(error["input"], dict | list):  # a rule across several keys of one section
        return f"{key}: {message}" if key else message
    return f"{key}={error['input']!r}: {message}" if key else message


def _problems(exc: ValidationError, section: str = "") -> str:
    """Every error of a validation as one line, keys dotted from `section` (the root if empty)."""
    described = []
    for error in exc.errors(include_url=False):
        line = _describe(error)
        described.append(f"{section}{'.' if error['loc'] else ': '}{line}" if section else line)
    return "; ".join(described)


S = TypeVar("S", bound=BaseModel)


def parse(sections: type[S], raw: Any, origin: str = str(PARAMS_FILE)) -> S:
    """`raw` (params.yaml as read) validated as `sections`; one line on the first problem."""
    if not isinstance(raw, dict):
        raise StageError(f"{origin}: expected a mapping of sections, got {type(raw).__name__}")
    try:
        return sections.model_validate(raw)
    except ValidationError as exc:
        raise StageError(f"{origin}: {_problems(exc)}") from None


def read_params_yaml(path: Path = PARAMS_FILE) -> Any:
    """params.yaml as written (no defaults filled in): what `dvc exp run -S` overrides refer to."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageError(f"{path}: not found (run from the repository root)") from None
    except yaml.YAMLError as exc:
        raise StageError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None


def load_sections(sections: type[S], path: Path = PARAMS_FILE) -> S:
    """The sections a stage reads, from params.yaml."""
    return parse(sections, read_params_yaml(path), str(path))
