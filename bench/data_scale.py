"""The data stages at growing corpus sizes: ingest -> clean -> tokenizer -> pack on generated corpora of
real English sentences (no near-duplicates), each stage a real `python -m stages.<name>` process.

    CORPUS_DIR=../shared/data/corpus python bench/data_scale.py --sizes-mb 100 1000 4000 [--work DIR]
    CORPUS_DIR=../shared/data/corpus python bench/data_scale.py --sizes-mb 100 --cluster
    python bench/data_scale.py --folder ../shared/data/corpus-large   # a real folder as it comes

For every size and stage: wall time, MB/s per core (of the corpus's text) and the peak RSS of the stage's
process tree (the stage and its workers, sampled every 0.1 s); then, per stage, the growth exponents
a and b of time ∝ size^a and RSS ∝ size^b (least squares on the logs). With --cluster, `clean` of the
first size once more in one process and on a local Dask cluster of 2 workers (127.0.0.1): the
speed-up and whether the outputs are the same bytes. With --folder, the stages on that folder as it is
(its source as the real-cpu profile gives it: `.txt` and `.txt.gz`, in chunks; WikiExtractor files and
Project Gutenberg books read as such), with what ingest and clean counted. One JSON line per
measure. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmpipe.layout import CLEAN_STORE  # noqa: E402

STAGES = ("ingest", "clean", "tokenizer", "pack")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def sentences(corpus: Path) -> list[str]:
    """The real sentences of the corpus folder (40-400 characters, one line each)."""
    found = []
    for path in sorted(corpus.glob("*.txt")):
        text = " ".join(path.read_text(encoding="utf-8", errors="replace").split())
        found += [s for s in _SENTENCE.split(text) if 40 <= len(s) <= 400]
    return found


def corpus_dir() -> Path:
    """CORPUS_DIR (default ../shared/data/corpus): the real text the corpora are made of."""
    corpus = Path(os.environ.get("CORPUS_DIR", ROOT.parent / "shared/data/corpus"))
    if not corpus.is_dir():
        sys.exit(f"error: CORPUS_DIR={corpus} is not a directory of real text")
    return corpus


def generate(folder: Path, pool: list[str], megabytes: float, seed: int = 0) -> int:
    """Documents of 5-40 random real sentences, blank-line separated, in files of ~64 MB."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    target, written, part = int(megabytes * 1_000_000), 0, 0
    handle = None
    while written < target:
        if handle is None or handle.tell() > 64_000_000:
            if handle:
                handle.close()
            handle = (folder / f"part-{part:04d}.txt").open("w", encoding="utf-8")
            part += 1
        doc = " ".join(rng.choices(pool, k=rng.randint(5, 40))) + "\n\n"
        handle.write(doc)
        written += len(doc)
    handle.close()
    return written


def peak_tree_rss(process: subprocess.Popen) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB of the process and its children) of a running process."""
    root, peak, start = psutil.Process(process.pid), 0, time.perf_counter()
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                members = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in members if p.is_running()))
            except psutil.Error:
                pass
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    process.wait()
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    return seconds, peak / 1e6


def run_stage(project: Path, stage: str, *args: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"sqlite:///{project}/mlflow.db"}
    command = [sys.executable, "-m", f"stages.{stage}", *args]
    process = subprocess.Popen(command, cwd=project, env=env, stderr=subprocess.PIPE, text=True)
    seconds, peak = peak_tree_rss(process)
    if process.returncode:
        sys.exit(f"error: {stage} failed:\n{process.stderr.read()[-2000:]}")
    return seconds, peak


def clean_outputs(project: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((project / "data/clean").iterdir())}


def compare_cluster(project: Path) -> None:
    from distributed import LocalCluster

    params_file = project / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["clean"]["workers"] = 1
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.rmtree(project / CLEAN_STORE, ignore_errors=True)  # every shard judged, not kept from before
    one_seconds, _ = run_stage(project, "clean")
    one = clean_outputs(project)
    workers = {"n_workers": 2, "threads_per_worker": 1, "env": {"PYTHONPATH": str(ROOT)}}
    with LocalCluster(host="127.0.0.1", dashboard_address=None, **workers) as cluster:
        params["cluster"]["scheduler"] = cluster.scheduler_address
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        shutil.rmtree(project / CLEAN_STORE)
        cluster_seconds, _ = run_stage(project, "clean")
    params["cluster"]["scheduler"] = None  # the cluster is gone: later runs of the project work here
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    row = {
        "measure": "clean_dask_cluster",
        "one_process_seconds": round(one_seconds, 1),
        "two_workers_seconds": round(cluster_seconds, 1),
        "speedup": round(one_seconds / cluster_seconds, 2),
        "same_bytes": clean_outputs(project) == one,
    }
    print(json.dumps(row), flush=True)


def project_for(project: Path, folder: Path, source: dict | None = None, vocab_size: int = 16000) -> None:
    """A project reading `folder` (as `source` says, default: its `.txt` files)."""
    project.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["ingest"]["sources"] = {"text": {**(source or {"include": ["*.txt"]}), "path": str(folder)}}
    params["tokenizer"]["vocab_size"] = vocab_size
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def measure_folder(folder: Path, work: Path) -> None:
    """The data stages on a real folder as it comes, read as the real-cpu profile reads its corpus:
    wall time, peak RSS, and what ingest and clean counted (articles, books, the Gutenberg
    boilerplate dropped)."""
    project = work / "project"
    profile = yaml.safe_load((ROOT / "flows/profiles/real-cpu.yaml").read_text())
    project_for(project, folder, profile["ingest"]["sources"]["corpus"])
    cores = len(os.sched_getaffinity(0))
    for stage in STAGES:
        seconds, peak = run_stage(project, stage, *(["text"] if stage == "ingest" else []))
        row = {"measure": "data_folder", "folder": folder.name, "stage": stage, "seconds": round(seconds, 1)}
        row |= {"peak_rss_mb": round(peak), "cores": cores}
        if stage == "ingest":
            row["counts"] = json.loads((project / "metrics/ingest/text.json").read_text())
        if stage == "clean":
            report = json.loads((project / "metrics/clean.json").read_text())
            kept = ("documents_in", "documents_kept", "characters_in", "characters_kept")
            row["counts"] = {key: report[key] for key in kept}
            row["counts"]["dropped"] = {rule: n for rule, n in report["dropped"].items() if n}
            gutenberg = report["dropped_characters"]["gutenberg_boilerplate"]
            row["counts"]["gutenberg_boilerplate_characters"] = gutenberg
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--vocab-size", type=int, default=16000, help="of the tokenizer stage")
    parser.add_argument("--cluster", action="store_true", help="clean: 1 process vs 2 Dask workers")
    parser.add_argument("--work", type=Path, help="for corpora and projects (default: a temporary one)")
    parser.add_argument("--folder", type=Path, help="a real corpus folder instead of generated sizes")
    args = parser.parse_args()
    if args.folder:
        measure_folder(args.folder.resolve(), args.work or Path(tempfile.mkdtemp(prefix="data-folder-")))
        return
    corpus = corpus_dir()
    work = args.work or Path(tempfile.mkdtemp(prefix="data-scale-"))
    pool = sentences(corpus)
    cores = len(os.sched_getaffinity(0))
    rows = []
    for megabytes in args.sizes_mb:
        text = work / f"corpus-{megabytes:g}mb"
        if text.exists():  # generated by an earlier run
            size = sum(p.stat().st_size for p in text.iterdir())
        else:
            size = generate(text, pool, megabytes)
        project = work / f"project-{megabytes:g}mb"
        project_for(project, text, vocab_size=args.vocab_size)
        for stage in STAGES:
            seconds, peak = run_stage(project, stage, *(["text"] if stage == "ingest" else []))
            row = {
                "measure": "data_scale",
                "stage": stage,
                "mb": round(size / 1e6, 1),
                "seconds": round(seconds, 1),
                "mb_per_s_per_core": round(size / 1e6 / seconds / cores, 2),
                "peak_rss_mb": round(peak),
                "cores": cores,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.cluster:
        compare_cluster(work / f"project-{args.sizes_mb[0]:g}mb")
    if len(args.sizes_mb) > 1:
        for stage in STAGES:
            points = [r for r in rows if r["stage"] == stage]
            logs = np.log([r["mb"] for r in points])
            a = np.polyfit(logs, np.log([r["seconds"] for r in points]), 1)[0]
            b = np.polyfit(logs, np.log([r["peak_rss_mb"] for r in points]), 1)[0]
            print(
                json.dumps(
                    {
                        "measure": "growth",
                        "stage": stage,
                        "time_exponent_a": round(a, 3),
                        "rss_exponent_b": round(b, 3),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
