"""What the flows share: their errors and command line, params overrides as `dvc exp run -S` takes
them, and running DVC with this interpreter's tools."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flows import EPHEMERAL_TIMEOUT_ENV
from lmpipe.params.schema import PARAMS_FILE, read_params_yaml
from lmpipe.runtime import StageError

EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a DVC experiment name is a git ref component

# params overrides from the environment: a work pool's job variables carry its device settings
PARAMS_OVERRIDES_ENV = "LMPIPE_PARAMS_OVERRIDES"


# Prefect's message when its temporary server never answered (flows/__init__.py sets how long it waits)
EPHEMERAL_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API server"


class PipelineError(Exception):
    """Bad flow input (unknown stage or params key): one line, no traceback."""


class FlowFailed(Exception):
    """The flow ran and some of its work failed: one line, exit code 1."""


def cli(body: Callable[[], str]) -> int:
    """A flow's command line: `body()` returns what to print on success; bad input is one line and
    exit code 2, failed work one line and exit code 1."""
    try:
        print(body())
    except (PipelineError, StageError) as exc:  # StageError: params.yaml itself is wrong
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FlowFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # Prefect's own error for a temporary server that never answered
        if not str(exc).startswith(EPHEMERAL_TIMEOUT):
            raise
        seconds = os.environ.get(EPHEMERAL_TIMEOUT_ENV)
        print(
            f"error: Prefect's temporary server did not answer within {seconds} s ({EPHEMERAL_TIMEOUT_ENV}): "
            "allow it longer, or run `prefect server start` and set PREFECT_API_URL",
            file=sys.stderr,
        )
        return 1
    return 0


def check_overrides(
    repo_dir: Path,
    overrides: Sequence[str],
    params: Mapping[str, Any] | None = None,
    origin: str | None = None,
) -> None:
    """Every `key=value` names a key of params.yaml (`+key=` adds one, `~key` deletes one, as in DVC), or of
    `params`: what the overrides apply to (params.yaml with a profile applied, named by `origin`)."""
    params_file = repo_dir / PARAMS_FILE
    if params is None:
        params = read_params_yaml(params_file) or {}
    where = origin or str(params_file)
    for override in overrides:
        key, sep, _ = override.partition("=")
        if key.startswith(("+", "~")):
            continue
        if not sep:
            raise PipelineError(f"params override '{override}' is not key=value")
        node: Any = params
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise PipelineError(f"params override '{override}': {where} has no key '{key}'")
            node = node[part]


def pool_overrides(explicit: Sequence[str] = ()) -> list[str]:
    """LMPIPE_PARAMS_OVERRIDES (space-separated key=value), minus the keys given explicitly."""
    given = {o.partition("=")[0].lstrip("+~") for o in explicit}
    pool = os.environ.get(PARAMS_OVERRIDES_ENV, "").split()
    return [o for o in pool if o.partition("=")[0].lstrip("+~") not in given]


def hydra_value(value: Any) -> str:
    """A value as `dvc exp run -S key=<value>` parses it back to the same YAML value."""
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # strings (quoted), numbers, true/false, null


def replacing(key: str, value: Any) -> list[str]:
    """`key: value` as -S overrides that replace what params.yaml has there: `-S key={...}` alone would
    merge a mapping into the one at `key`, keeping the keys `value` leaves out."""
    return [f"~{key}", f"++{key}={hydra_value(value)}"]


def apply_overrides(repo_dir: Path, overrides: Sequence[str]) -> None:
    """`key=value` into params.yaml with the semantics of `dvc exp run -S`."""
    if overrides:
        from dvc.utils.hydra import apply_overrides as dvc_apply

        check_overrides(repo_dir, overrides)
        dvc_apply(str(repo_dir / PARAMS_FILE), list(overrides))


THREADS_ENV = "OMP_NUM_THREADS"  # PyTorch's intra-op threads, read when a process starts


def threads_each(at_once: int) -> dict[str, str]:
    """OMP_NUM_THREADS for each of `at_once` processes sharing this machine's cores: its share of them.
    PyTorch's OpenMP threads spin while they wait, so processes that together ask for more threads than
    there are cores run several times slower (two `tiny` training loops at once on 2 cores: 73 s with 2
    threads each, 26 s with 1; bench/threads.py, docs/benchmarks.md). A setting of the user's wins."""
    if os.environ.get(THREADS_ENV):
        return {}
    return {THREADS_ENV: str(max(1, len(os.sched_getaffinity(0)) // max(1, at_once)))}


def stage_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # stage commands say `python`: the interpreter of this flow, as when DVC runs from this venv
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "DVC_NO_ANALYTICS": "1", **(extra or {})}


def dvc(repo_dir: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dvc", "--wait-for-lock", *args],
        cwd=repo_dir,
        env=stage_env(env),
        capture_output=True,
        text=True,
    )


def dvc_checked(repo_dir: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """`dvc <args>` that must succeed: its output, else RuntimeError with the line that says why."""
    result = dvc(repo_dir, *args, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"dvc {' '.join(args[:2])}: {error_line(result.stderr or result.stdout)}")
    return result.stdout + result.stderr


def git(repo_dir: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True)
    if result.returncode != 0:
        raise PipelineError(f"git {' '.join(args)} in {repo_dir}: {last_line(result.stderr)}")
    return result.stdout.strip()


def drop_finished_run(repo_dir: Path, experiment: str) -> bool:
    """Remove HEAD's experiment `experiment` if an earlier run finished one (`dvc exp run --name`
    refuses a name HEAD already has), and say whether it did; run again, its stages come back from
    the run cache. An experiment of that name on another commit does not clash and stays."""
    from dvc.repo.experiments.refs import ExpRefInfo

    ref = str(ExpRefInfo(baseline_sha=git(repo_dir, "rev-parse", "HEAD"), name=experiment))
    if not git(repo_dir, "for-each-ref", ref):
        return False
    dvc_checked(repo_dir, "exp", "remove", ref)
    return True


def exp_run(
    experiment: str, overrides: Sequence[str], targets: Sequence[str] = (), pull: bool = False
) -> list[str]:
    """The arguments of `dvc exp run` for one named experiment in a temporary workspace, params as its
    `-S` overrides; `targets` only, if given; `pull`: what the run cache and remote have, pulled."""
    sets = [arg for override in overrides for arg in ("-S", override)]
    return ["exp", "run", "--temp", *(["--pull"] if pull else []), "--name", experiment, *sets, *targets]


def stages_ran(output: str) -> list[str]:
    """The stages DVC ran, in order, from its output's `Running stage '<name>'` lines."""
    return re.findall(r"Running stage '([^']+)'", output)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# DVC 3.67 restores a stage from the run cache while it still reads the commit's dvc.lock: a directory
# that lock names, missing from the cache, stops it when the stage depends on a path inside it
_MISSING_DIRECTORY = re.compile(
    r"failed to load directory \(([^)]*)\).*No such file or directory: '[^']*\.dir'"
)


# the last line of a Python traceback: what a stage that crashed (no `error:` line of its own) raised
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception): .+")


def error_line(text: str) -> str:
    """What went wrong in a command's output: the last line a stage printed as `error: …` (its
    one-line message, which DVC follows with its own `failed to reproduce`), else the last line, with
    what a crashed stage raised beside it; with the cause and the way out where DVC's message gives
    neither."""
    errors = [line.strip() for line in text.splitlines() if line.startswith("error: ")]
    line = errors[-1] if errors else last_line(text)
    raised = [found.strip() for found in text.splitlines() if _RAISED.match(found.strip())]
    if not errors and raised and raised[-1] != line:
        line += f" ({raised[-1]})"
    if missing := _MISSING_DIRECTORY.search(line):
        path = "/".join(re.findall(r"'([^']*)'", missing.group(1)))  # ('data', 'glue') -> data/glue
        line += (
            f" ({path} as the commit's dvc.lock records it is not in the DVC cache, and DVC cannot restore"
            " a stage from the run cache past it: `dvc pull` it, or `dvc repro` and commit dvc.lock)"
        )
    return line
