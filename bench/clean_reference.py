"""`clean` side by side with datatrove's pipeline of the same rules, on the same documents and cores.

    CORPUS_DIR=../shared/data/corpus python bench/clean_reference.py [--generated-mb 100] [--work DIR]

The corpus: the real text of CORPUS_DIR cut into documents of up to 3,000 characters at paragraph
boundaries, plus planted duplicates: an exact copy of every 10th document and a near copy (1 % of its
words replaced: Jaccard of its 5-word shingles ~0.9) of every 10th, 5th from it. With --generated-mb,
data_scale.py's generated corpus of that size instead (real sentences, no duplicates): the speed test.

Both read the output of our `ingest` (datatrove from the same rows written as 2 files per core, its unit
of parallel work), on every core. Ours: `python -m stages.clean` (params.yaml's `clean` section).
The reference: datatrove 0.10.1 on its LocalPipelineExecutor, as FineWeb runs it (a filtering pipeline
writing its survivors, then MinHash signatures, buckets, clusters and the filter), each of our rules
mapped to its datatrove counterpart:

    too_few/many_chars              LambdaFilter on the character count (datatrove has none)
    too_few_words, mean_word_length GopherQualityFilter's doc words and average word length
    alpha_ratio                     GopherQualityFilter's non-alpha-words ratio (Gopher's 0.8)
    symbol_ratio                    GopherQualityFilter's symbol-to-word ratio (Gopher's 0.1)
    digit_ratio                     (no counterpart)
    duplicate_lines/_line_chars,
    top_ngram, duplicate_ngrams     GopherRepetitionFilter with the same thresholds (paragraph rules off)
    bad_phrase                      C4QualityFilter with only its "lorem ipsum" rule on
    exact_/near_duplicate           MinHash (5-word shingles, the same bands x rows: 9 x 13)

Printed, one JSON line each: wall time of both and the ratio; documents kept by each and the Jaccard
of the two kept sets; the planted copies each removed; and for every document one keeps and the other
drops, the rule that dropped it, counted. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_scale import ROOT, corpus_dir, generate, run_stage, sentences  # noqa: E402

from lmpipe.data.dedup import lsh_params  # noqa: E402
from lmpipe.data.quality import failed_rule, normalize  # noqa: E402
from lmpipe.data.splitting import join_paragraphs, split_long  # noqa: E402
from lmpipe.params.clean import CleanParams  # noqa: E402

MAX_DOC_CHARS = 3000
# `all`: params.yaml's rules, each with its datatrove counterpart; `same_definitions`: without the three
# character-ratio rules, whose datatrove counterparts are defined otherwise (on words, not characters)
RULE_SETS = {
    "all": {},
    "same_definitions": {"min_alpha_ratio": 0.0, "max_digit_ratio": 1.0, "max_symbol_ratio": 1.0},
}


def planted_corpus(corpus: Path, out: Path, seed: int = 0) -> dict[str, int]:
    """The real documents and their planted copies as one JSONL file; their counts."""
    paragraphs = []
    for path in sorted(corpus.glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        paragraphs += [p.strip() for p in text.split("\n\n") if p.strip()]
    docs = [
        part for doc in join_paragraphs(paragraphs, MAX_DOC_CHARS) for part in split_long(doc, MAX_DOC_CHARS)
    ]
    rng = random.Random(seed)
    vocabulary = sorted({w for doc in docs[:200] for w in doc.split()})
    rows = []
    for i, doc in enumerate(docs):
        rows.append({"text": doc, "planted": "original"})
        if i % 10 == 0:
            rows.append({"text": doc, "planted": "exact"})
        if i % 10 == 5:
            words = doc.split()
            for k in rng.sample(range(len(words)), max(1, len(words) // 100)):
                words[k] = rng.choice(vocabulary)
            rows.append({"text": " ".join(words), "planted": "near"})
    out.mkdir(parents=True, exist_ok=True)
    with (out / "documents.jsonl").open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"text": row["text"]}) + "\n")
    (out.parent / f"{out.name}-planted.json").write_text(json.dumps([r["planted"] for r in rows]))
    return Counter(r["planted"] for r in rows)


def datatrove_input(rows: dict[str, str], folder: Path, files: int) -> None:
    """Our ingest's documents in corpus order, normalised as `clean` normalises them (so both judge the
    same text), as `files` parquet files (datatrove's unit of work)."""
    table = pa.table({"id": list(rows), "text": [normalize(text) for text in rows.values()]})
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-table.num_rows // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), folder / f"{i:03d}.parquet")


def datatrove_pipeline(inputs: Path, work: Path, cfg: CleanParams, seed: int, workers: int) -> float:
    """Seconds of datatrove's filtering and MinHash dedup; survivors in work/kept/*.jsonl.gz."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.readers import JsonlReader, ParquetReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    tasks = len(list(inputs.glob("*.parquet")))
    bands, rows = lsh_params(cfg.near_dedup.threshold, cfg.near_dedup.num_perm)
    minhash = MinhashConfig(
        n_grams=cfg.near_dedup.shingle_words,
        num_buckets=bands,
        hashes_per_bucket=rows,
        seed=seed,
        hash_config=HashConfig(precision=64),
    )
    filtering = [
        ParquetReader(str(inputs), text_key="text", id_key="id"),
        *datatrove_rules(cfg),
        JsonlWriter(str(work / "filtered")),
    ]
    filtered = str(work / "filtered")
    steps = [
        (filtering, tasks),
        ([JsonlReader(filtered), MinhashDedupSignature(str(work / "signatures"), config=minhash)], tasks),
        ([MinhashDedupBuckets(str(work / "signatures"), str(work / "buckets"), config=minhash)], bands),
        ([MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=minhash)], 1),
        (
            [
                JsonlReader(filtered),
                MinhashDedupFilter(str(work / "remove")),
                JsonlWriter(str(work / "kept")),
            ],
            tasks,
        ),
    ]
    start = time.perf_counter()
    for name, (pipeline, n_tasks) in zip(
        ("filter", "signatures", "buckets", "cluster", "dedup"), steps, strict=True
    ):
        LocalPipelineExecutor(
            pipeline=pipeline,
            tasks=n_tasks,
            workers=min(workers, n_tasks),
            logging_dir=str(work / "logs" / name),
        ).run()
    return time.perf_counter() - start


def _gopher_quality(cfg: CleanParams) -> dict:
    return {
        "min_doc_words": cfg.min_words,
        "max_doc_words": None,
        "min_avg_word_length": cfg.min_mean_word_length,
        "max_avg_word_length": cfg.max_mean_word_length,
        "max_non_alpha_words_ratio": 0.8 if cfg.min_alpha_ratio > 0 else None,
        "max_symbol_word_ratio": 0.1 if cfg.max_symbol_ratio < 1 else None,
        "max_bullet_lines_ratio": None,
        "max_ellipsis_lines_ratio": None,
        "min_stop_words": None,
    }


def _gopher_repetition(cfg: CleanParams) -> dict:
    return {
        "dup_line_frac": cfg.max_duplicate_line_fraction,
        "dup_para_frac": None,
        "dup_line_char_frac": cfg.max_duplicate_line_char_fraction,
        "dup_para_char_frac": None,
        "top_n_grams": tuple(sorted(cfg.max_top_ngram_char_fraction.items())),
        "dup_n_grams": tuple(sorted(cfg.max_duplicate_ngram_char_fraction.items())),
    }


def _c4_lorem_ipsum_only() -> dict:
    return {
        "remove_citations": False,
        "filter_no_terminal_punct": False,
        "min_num_sentences": -1,
        "min_words_per_line": -1,
        "max_word_length": -1,
        "filter_javascript": False,
        "filter_curly_bracket": False,
        "filter_policy": False,
    }


def datatrove_rules(cfg: CleanParams) -> list:
    """Our rules as datatrove's filters, in our order (the mapping of the module's docstring)."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LambdaFilter,
    )

    min_chars, max_chars = cfg.min_chars, cfg.max_chars
    length = LambdaFilter(lambda doc: min_chars <= len(doc.text) <= max_chars)
    length.name = "length"  # the name a drop by it is counted under
    return [
        length,
        GopherQualityFilter(**_gopher_quality(cfg)),
        GopherRepetitionFilter(**_gopher_repetition(cfg)),
        C4QualityFilter(**_c4_lorem_ipsum_only()),
    ]


def datatrove_reason(text: str, rules: list) -> str:
    """The first of datatrove's `rules` that drops `text`, or that it passed them all."""
    from datatrove.data import Document

    doc = Document(text=text, id="0")
    for rule in rules:
        verdict = rule.filter(doc)
        if not (verdict[0] if isinstance(verdict, tuple) else verdict):
            return verdict[1] if isinstance(verdict, tuple) else rule.name
    return "passed its filters: a MinHash duplicate"


def kept_ids_datatrove(work: Path) -> set[str]:
    import gzip

    kept = set()
    for path in sorted((work / "kept").glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            kept.update(json.loads(line)["id"] for line in handle)
    return kept


def compare(project: Path, rules: str, planted: list[str] | None, work: Path, cores: int) -> None:
    """Both pipelines on the project's ingested corpus with one rule set; JSON lines of what they did."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["clean"].update(RULE_SETS[rules])
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    cfg = CleanParams(**params["clean"])
    raw = project / "data/raw/text"
    rows = {r["id"]: r["text"] for p in sorted(raw.glob("*.parquet")) for r in pq.read_table(p).to_pylist()}
    megabytes = sum(map(len, rows.values())) / 1e6

    ours_seconds, _ = run_stage(project, "clean")
    clean_parts = sorted((project / "data/clean").glob("part-*.parquet"))
    ours = {doc_id for part in clean_parts for doc_id in pq.read_table(part)["id"].to_pylist()}
    reference = work / f"datatrove-{project.name}-{rules}"
    shutil.rmtree(reference, ignore_errors=True)
    datatrove_input(rows, reference / "input", 2 * cores)
    theirs_seconds = datatrove_pipeline(reference / "input", reference, cfg, params["seed"], cores)
    theirs = kept_ids_datatrove(reference)
    summary = {
        "measure": "clean_vs_datatrove",
        "corpus": "real+planted" if planted else "generated",
        "rules": rules,
        "mb": round(megabytes, 1),
        "cores": cores,
        "ours_seconds": round(ours_seconds, 1),
        "datatrove_seconds": round(theirs_seconds, 1),
        "speedup": round(theirs_seconds / ours_seconds, 2),
        "ours_mb_per_s_per_core": round(megabytes / ours_seconds / cores, 2),
        "datatrove_mb_per_s_per_core": round(megabytes / theirs_seconds / cores, 2),
        "documents": len(rows),
        "ours_kept": len(ours),
        "datatrove_kept": len(theirs),
        "kept_jaccard": round(len(ours & theirs) / len(ours | theirs), 4),
    }
    print(json.dumps(summary), flush=True)
    order = list(rows)
    if planted is not None:
        if len(order) != len(planted):
            sys.exit(f"error: ingest made {len(order)} documents of the {len(planted)} planted lines")
        for kind in ("exact", "near"):
            copies = [order[i] for i, p in enumerate(planted) if p == kind]
            removed = {
                "ours": round(sum(c not in ours for c in copies) / len(copies), 4),
                "datatrove": round(sum(c not in theirs for c in copies) / len(copies), 4),
            }
            row = {"measure": "planted_copies_removed", "rules": rules, "kind": kind, "copies": len(copies)}
            print(json.dumps({**row, **removed}), flush=True)
    filters = datatrove_rules(cfg)
    for side, kept, other in (("ours", ours, theirs), ("datatrove", theirs, ours)):
        reasons = Counter()
        for doc_id in sorted(kept - other):
            text = normalize(rows[doc_id])
            if side == "ours":
                reasons[datatrove_reason(text, filters)] += 1
            else:
                reasons[failed_rule(text, cfg) or "passed our rules: a duplicate"] += 1
        row = {"measure": "kept_only_by", "rules": rules, "side": side, "dropped_by_the_other": dict(reasons)}
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generated-mb", type=float, help="data_scale.py's generated corpus of this size")
    parser.add_argument("--work", type=Path, help="corpora and projects (default: a temporary one)")
    parser.add_argument(
        "--rules", choices=list(RULE_SETS), nargs="+", help="the rule sets compared (default: all of them)"
    )
    args = parser.parse_args()
    corpus = corpus_dir()
    work = args.work or Path(tempfile.mkdtemp(prefix="clean-reference-"))
    cores = len(os.sched_getaffinity(0))
    if args.generated_mb:
        text, planted = work / f"generated-{args.generated_mb:g}mb", None
        if not text.exists():
            generate(text, sentences(corpus), args.generated_mb)
        source = {"path": str(text), "include": ["*.txt"]}
    else:
        text = work / "planted"
        counts = planted_corpus(corpus, text)
        planted = json.loads((work / "planted-planted.json").read_text())
        print(json.dumps({"measure": "corpus", **counts}), flush=True)
        source = {"path": str(text / "documents.jsonl")}
    project = work / f"project-{text.name}"
    project.mkdir(exist_ok=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["ingest"]["sources"] = {"text": source}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run_stage(project, "ingest", "text")
    for rules in args.rules or (list(RULE_SETS) if planted else ["all"]):
        compare(project, rules, planted, work, cores)


if __name__ == "__main__":
    main()
