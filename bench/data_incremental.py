"""A corpus that grows: `dvc repro pack` on real text at growing sizes, first from nothing, then after
one book is added, against the same stages from scratch on the grown corpus.

    python bench/data_incremental.py [--folder ../shared/data/corpus-large] [--sizes-mb 50 100 200]

For each size: a fresh clone of this repository's HEAD whose one source is a folder of that many MB
(uncompressed) of the folder's files (a seeded draw of them, Wikipedia extracts and Gutenberg books
alike), read as the `real-cpu` profile reads its corpus (16,000 pieces). It times `dvc repro pack`
from nothing (`first`); then `dvc freeze tokenizer`, one book of about 1.2 MB added to the folder, and
`dvc repro pack` again (`one_file_added`: ingest reads the book, clean judges its shard, pack encodes
it and any shard whose documents' fate it changed); then the same stages from scratch on the grown
corpus with the same tokenizer (`data/.kept` removed, `dvc repro --force pack`), and whether the two
wrote the same bytes (every output's md5 in dvc.lock); last, `dvc unfreeze tokenizer` and `dvc repro
pack` with the tokenizer trained again (`tokenizer_trained_again`: a new tokenizer changes every
token id, so pack encodes every shard). Wall time and the peak RSS of DVC's process tree, one JSON
line each, and the ratio of the added book's run to the first. Not a test: nothing here asserts a
time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_scale import peak_tree_rss  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BOOK_BYTES = 1_200_000
DATA_STAGES = ("ingest@corpus", "clean", "tokenizer", "pack")


def text_bytes(path: Path) -> int:
    """The file's size as text: a .gz file's from its trailer (the size modulo 2**32)."""
    if path.suffix != ".gz":
        return path.stat().st_size
    with path.open("rb") as handle:
        handle.seek(-4, os.SEEK_END)
        return int.from_bytes(handle.read(4), "little")


def draw_files(folder: Path, megabytes: float, book: Path) -> list[Path]:
    """A seeded draw of the folder's files (the book left out) up to `megabytes` of text."""
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".txt", ".txt.gz")) and p != book)
    random.Random(0).shuffle(files)
    chosen, total = [], 0
    for path in files:
        if total >= megabytes * 1e6:
            break
        chosen.append(path)
        total += text_bytes(path)
    return sorted(chosen)


def the_book(folder: Path) -> Path:
    """The Gutenberg book of the folder nearest to BOOK_BYTES of text."""
    books = [p for p in folder.iterdir() if p.name.startswith("gutenberg_")]
    return min(books, key=lambda p: abs(text_bytes(p) - BOOK_BYTES))


def dvc(project: Path, *args: str) -> tuple[float, float, str]:
    """`dvc <args>` in the project: (wall seconds, peak RSS MB of its process tree, its stderr)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env |= {"DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(project)}
    # a folder of its own for temporary files (below), where the stages look for the process that writes
    # their MLflow runs: each command starts one, as a run a day after the last would (run_writer.py)
    env.pop("MLFLOW_TRACKING_URI", None)  # the clone's own mlflow.db
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # Python's default: a stage's second start reads bytecode
    command = [sys.executable, "-m", "dvc", *args]
    with tempfile.TemporaryDirectory(prefix="dvc-", dir="/tmp") as tmp, tempfile.TemporaryFile("w+") as log:
        env["TMPDIR"] = tmp
        process = subprocess.Popen(  # (a log file, not a pipe: a long log cannot block the run)
            command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True
        )
        seconds, peak = peak_tree_rss(process)
        log.seek(0)
        stderr = log.read()
    if process.returncode:
        sys.exit(f"error: dvc {' '.join(args)} failed:\n{stderr[-3000:]}")
    return seconds, peak, stderr


def outputs_md5(project: Path) -> dict[str, str]:
    """Each data stage's outputs and metrics, path -> md5, as dvc.lock records them."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    return {
        f"{stage}:{out['path']}": out["md5"]
        for stage in DATA_STAGES
        if stage != "tokenizer"
        for out in lock[stage].get("outs", [])
    }


def said(stderr: str, *prefixes: str) -> list[str]:
    """The stages' log lines that say what was kept and what was done again."""
    return [line.split("lmpipe: ", 1)[-1] for line in stderr.splitlines() if any(p in line for p in prefixes)]


def measure(folder: Path, megabytes: float, work: Path, vocab_size: int) -> None:
    book = the_book(folder)
    corpus = work / f"corpus-{megabytes:g}mb"
    shutil.rmtree(corpus, ignore_errors=True)
    corpus.mkdir(parents=True)
    files = draw_files(folder, megabytes, book)
    for path in files:
        (corpus / path.name).symlink_to(path)
    size = sum(text_bytes(p) for p in files)
    project = work / f"project-{megabytes:g}mb"
    shutil.rmtree(project, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    (project / "dvc.lock").unlink(missing_ok=True)
    params = yaml.safe_load((project / "params.yaml").read_text())
    profile = yaml.safe_load((ROOT / "flows/profiles/real-cpu.yaml").read_text())
    params["ingest"]["sources"] = {"corpus": {**profile["ingest"]["sources"]["corpus"], "path": str(corpus)}}
    params["tokenizer"] |= profile["tokenizer"] | {"vocab_size": vocab_size}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    base = {"measure": "data_incremental", "mb": round(size / 1e6, 1), "files": len(files)}

    def report(run: str, seconds: float, peak: float, **extra: object) -> None:
        row = {**base, "run": run, "seconds": round(seconds, 1), "peak_rss_mb": round(peak), **extra}
        print(json.dumps(row), flush=True)

    first, first_peak, _ = dvc(project, "repro", "pack")
    report("first", first, first_peak)
    dvc(project, "freeze", "tokenizer")
    (corpus / book.name).symlink_to(book)
    added, added_peak, log = dvc(project, "repro", "pack")
    grown = outputs_md5(project)
    kept = said(log, "ingest corpus: read", "shards judged by", "shards kept from")
    report("one_file_added", added, added_peak, book=book.name, book_mb=round(text_bytes(book) / 1e6, 2))
    print(
        json.dumps({**base, "measure": "data_incremental_ratio", "added_over_first": round(added / first, 3)})
    )
    print(json.dumps({**base, "measure": "data_incremental_log", "lines": kept}), flush=True)
    shutil.rmtree(project / "data/.kept")
    scratch, scratch_peak, _ = dvc(project, "repro", "--force", "pack")
    report("from_scratch_grown", scratch, scratch_peak, same_bytes=outputs_md5(project) == grown)
    dvc(project, "unfreeze", "tokenizer")
    # (the forced run above recorded the frozen tokenizer as up to date: train it again by name)
    trained, trained_peak, _ = dvc(project, "repro", "--force", "--single-item", "tokenizer")
    again, again_peak, _ = dvc(project, "repro", "pack")
    report("tokenizer_trained_again", trained + again, max(trained_peak, again_peak))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("CORPUS_DIR", ROOT.parent / "shared/data/corpus")).parent / "corpus-large"
    parser.add_argument(
        "--folder", type=Path, default=default, help="of .txt / .txt.gz files, books among them"
    )
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[50, 100, 200])
    parser.add_argument("--vocab-size", type=int, default=16000, help="of the tokenizer (real-cpu's)")
    parser.add_argument("--work", type=Path, help="for the corpora and clones (default: a temporary one)")
    args = parser.parse_args()
    if not args.folder.is_dir() or not any(args.folder.glob("gutenberg_*")):
        sys.exit(f"error: --folder {args.folder}: not a folder with Gutenberg books (gutenberg_*.txt[.gz])")
    work = args.work or Path(tempfile.mkdtemp(prefix="data-incremental-"))
    for megabytes in args.sizes_mb:
        measure(args.folder.resolve(), megabytes, work, args.vocab_size)


if __name__ == "__main__":
    main()
