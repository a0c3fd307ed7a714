"""Profiles: named params overlays (flows/profiles/<name>.yaml) run as one DVC experiment.

    python -m flows.profile real-cpu --corpus /path/to/text --glue /path/to/glue_data
    make repro PROFILE=real-cpu CORPUS=/path/to/text GLUE=/path/to/glue_data

A profile is a partial params.yaml. Its values become `dvc exp run -S` overrides (`++key=value`, so
keys the workspace's params.yaml lacks are added), `{corpus}` and `{glue}` in its strings become the
given folders, and the experiment runs with `--temp`: in a temporary copy of the workspace, whose
params.yaml (the offline default) stays as it is. The result is a normal DVC experiment (`dvc exp
show`, `dvc exp apply <name>`) whose stage runs nest under one MLflow run; its report is copied to
reports/profiles/<name>/. The merged params are validated before anything runs.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import functools
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from flows.common import (
    EXPERIMENT_NAME,
    FlowFailed,
    PipelineError,
    cli,
    drop_finished_run,
    exp_run,
    hydra_value,
    pool_overrides,
    replacing,
    stage_env,
)
from lmpipe.params.project import Params, parse_params
from lmpipe.params.schema import PARAMS_FILE
from lmpipe.runtime import StageError
from lmpipe.tracking import FlowTracking, child_env, flatten, git_commit

PROFILES = Path(__file__).resolve().parent / "profiles"
PLACEHOLDERS = ("corpus", "glue")
AVAILABLE = "available"  # glue.tasks of a profile: every task its GLUE folder has
# collections of named things: a profile's replace the workspace's (its corpus, not the sample too)
REPLACED = ("ingest.sources", "hub")
REPORTS = ("reports/glue.md", "reports/glue.csv", "reports/glue.png", "metrics/glue.json")


def available() -> list[str]:
    return sorted(path.stem for path in PROFILES.glob("*.yaml"))


def load(name: str) -> dict[str, Any]:
    path = PROFILES / f"{name}.yaml"
    if not path.exists():
        raise PipelineError(f"profile '{name}' is unknown (profiles: {', '.join(available())})")
    return yaml.safe_load(path.read_text()) or {}


def _fill(value: Any, folders: Mapping[str, str | None], profile: str) -> Any:
    if isinstance(value, str):
        for key in PLACEHOLDERS:
            if "{" + key + "}" in value:
                if not folders.get(key):
                    raise PipelineError(f"profile '{profile}' reads {key} data: give --{key} <folder>")
                value = value.replace("{" + key + "}", folders[key])
        return value
    if isinstance(value, list):
        return [_fill(v, folders, profile) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, folders, profile) for k, v in value.items()}
    return value


def overrides(name: str, corpus: str | None = None, glue: str | None = None) -> list[str]:
    """The profile as `++key=value` overrides, its folders made absolute (experiments run elsewhere)."""
    folders = {
        "corpus": str(Path(corpus).resolve()) if corpus else None,
        "glue": str(Path(glue).resolve()) if glue else None,
    }
    for key, folder in folders.items():
        if folder and not Path(folder).is_dir():
            raise PipelineError(f"--{key} {folder}: not a directory")
    tree = _fill(load(name), folders, name)
    _resolve_glue_tasks(tree, name)
    replaced = []
    for dotted in REPLACED:
        *parents, last = dotted.split(".")
        node = tree
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            replaced += replacing(dotted, node.pop(last))
    tree = {k: v for k, v in tree.items() if v != {}}  # a section that held only a replaced key
    return [*replaced, *(f"++{key}={hydra_value(value)}" for key, value in flatten(tree).items())]


def _resolve_glue_tasks(tree: dict[str, Any], profile: str) -> None:
    """`glue.tasks: available`: the GLUE tasks whose folders are in the profile's GLUE folder."""
    from lmpipe.glue.tasks import TASKS

    glue = tree.get("glue") or {}
    if glue.get("tasks") != AVAILABLE:
        return
    folder = Path(glue["path"])
    glue["tasks"] = [name for name, task in TASKS.items() if (folder / task.folder).is_dir()]
    if not glue["tasks"]:
        folders = ", ".join(task.folder for task in TASKS.values())
        raise PipelineError(f"profile '{profile}': {folder} has no GLUE task folder ({folders})")


def gpu_needed(params: Params, profile: str) -> None:
    """A profile that trains on a GPU stops here, in one line, on a machine without one."""
    accelerators = {
        "pretrain.accelerator": params.pretrain.accelerator,
        "finetune.common.accelerator": params.finetune.common.accelerator,
    }
    keys = [key for key, accelerator in accelerators.items() if accelerator == "gpu"]
    if keys:
        import torch

        if not torch.cuda.is_available():
            raise PipelineError(
                f"profile {profile} needs a GPU ({' and '.join(keys)} = gpu) and torch sees no CUDA "
                "device here; on a CPU run the real-cpu profile"
            )


def applied(repo_dir: Path, all_overrides: Sequence[str], origin: str) -> dict[str, Any]:
    """params.yaml with the overrides applied as `dvc exp run -S` applies them, as a stage will read it.

    DVC's own steps (dvc.utils.hydra.apply_overrides): the round-trip parse, hydra's overrides on
    an OmegaConf copy, the merge back and the dump, here without the file. A sweep or a card asks
    for every point, so what does not change between calls is made once: the parse of params.yaml
    (0.12 s a call) and the grammar's parser."""
    from dvc.utils.collections import merge_dicts, remove_missing_keys, to_omegaconf
    from dvc.utils.serialize import dumps_yaml
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    try:
        data = copy.deepcopy(_round_trip_parsed((repo_dir / PARAMS_FILE).read_text()))
        new = OmegaConf.create(to_omegaconf(data), flags={"allow_objects": True})
        OmegaConf.set_struct(new, True)
        parsed = _overrides_parser().parse_overrides(overrides=list(all_overrides))
        ConfigLoaderImpl._apply_overrides_to_config(parsed, new)
        merged = OmegaConf.to_object(new)
    except Exception as exc:  # a parse error of params.yaml or of an override: one line
        where = f"override '{exc.override}': " if getattr(exc, "override", None) else ""
        raise PipelineError(f"{origin}: {where}{' '.join(str(exc).split())}") from None
    remove_missing_keys(merge_dicts(data, merged), merged)
    return yaml.load(dumps_yaml(data), Loader=SAFE_LOADER) or {}


# yaml.safe_load's loader in libyaml's C where PyYAML has it: the same resolver; params.yaml in 1.3 ms, not 13
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _overrides_parser() -> Any:
    """Hydra's override grammar, as dvc.utils.hydra.to_hydra_overrides builds it on every call."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=4)
def _round_trip_parsed(text: str) -> Any:
    """params.yaml as DVC parses it to update it (comments and order kept); callers copy it."""
    from dvc.utils.serialize import parse_yaml_for_update

    return parse_yaml_for_update(text, PARAMS_FILE)


def parsed(raw: dict[str, Any], origin: str) -> Params:
    """Applied params (`applied`) checked as a stage checks them; a bad key or value is one line."""
    try:
        return parse_params(raw, origin)
    except StageError as exc:
        raise PipelineError(str(exc)) from None


def validate(repo_dir: Path, all_overrides: Sequence[str], origin: str) -> Params:
    """params.yaml with the overrides applied, as a stage will see it; a bad key or value is one line."""
    return parsed(applied(repo_dir, all_overrides, origin), origin)


def run(
    profile: str,
    corpus: str | None = None,
    glue: str | None = None,
    extra: Sequence[str] = (),
    name: str | None = None,
    repo: str = ".",
) -> Path:
    """Run the profile as the DVC experiment `name`; returns the folder its report was copied to."""
    repo_dir = Path(repo).resolve()
    name = name or f"{profile}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}"
    if not EXPERIMENT_NAME.match(name):
        raise PipelineError(f"experiment name '{name}': letters, digits, '-', '_' and '.' only")
    given = [*overrides(profile, corpus, glue), *extra]
    given = [*pool_overrides(given), *given]
    params = validate(repo_dir, given, f"profile {profile}")
    gpu_needed(params, profile)

    tracking = FlowTracking(repo_dir, params.tracking.experiment)
    parent = tracking.start(
        name, {"stage": "profile", "profile": profile, "dvc_experiment": name, "git_commit": git_commit()}
    )
    tracking.log(parent, {}, {"overrides": " ".join(given)})
    if drop_finished_run(repo_dir, name):
        print(f"profile {profile}: {name} finished before; again from the run cache", flush=True)
    command = [sys.executable, "-m", "dvc", *exp_run(name, given)]
    env = stage_env(child_env(parent, tracking.uri))
    print(f"profile {profile}: dvc experiment {name}", flush=True)
    result = subprocess.run(command, cwd=repo_dir, env=env)  # its progress goes to the terminal
    tracking.client.set_terminated(parent, "FINISHED" if result.returncode == 0 else "FAILED")
    if result.returncode != 0:
        raise ProfileFailed(f"profile {profile}: dvc exp run {name} failed (exit {result.returncode})")

    from dvc.api import DVCFileSystem

    experiment = DVCFileSystem(str(repo_dir), rev=name)  # the experiment's outputs, from the cache
    out = repo_dir / "reports" / "profiles" / name
    out.mkdir(parents=True, exist_ok=True)
    for path in REPORTS:
        (out / Path(path).name).write_bytes(experiment.read_bytes(path))
        tracking.client.log_artifact(parent, str(out / Path(path).name))
    return out


class ProfileFailed(FlowFailed):
    pass


def first_table(report: str) -> str:
    """The report's results table (what `make repro` prints)."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Model"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.profile", description=__doc__.split("\n")[0])
    parser.add_argument("profile", help=f"one of: {', '.join(available())}")
    parser.add_argument("--corpus", help="the folder of the pretraining text (its {corpus})")
    parser.add_argument("--glue", help="the GLUE folder in the original TSV layout (its {glue})")
    parser.add_argument("-S", "--set", action="append", dest="extra", default=[], metavar="KEY=VALUE")
    parser.add_argument("--name", help="the DVC experiment's name (default: profile and UTC time)")
    parser.add_argument("--repo", default=".", help="the DVC project (default: here)")
    args = parser.parse_args(argv)

    def body() -> str:
        out = run(args.profile, args.corpus, args.glue, args.extra, args.name, args.repo)
        return (
            f"\nGLUE report: {out / 'glue.md'} (every seed: glue.csv; chart: glue.png)\n"
            f"{first_table((out / 'glue.md').read_text())}\n"
            f"Apply the experiment's outputs to the workspace: dvc exp apply {out.name}"
        )

    return cli(body)


if __name__ == "__main__":
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    sys.exit(main())
