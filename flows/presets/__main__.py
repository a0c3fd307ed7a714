"""Two tables made from the cards: docs/experiments.md's presets, and the README's status of each
preset (its rows; its run on real text, from docs/results/presets-on-real-text.csv; its research runs,
the research log's entries that name it on a `Preset:` line). `python -m flows.presets --write`
rewrites both, `python -m flows.presets` says whether they are current (tests/test_presets.py runs it)."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import yaml

from flows.presets import CARDS, COMPUTE

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "experiments.md"
BEGIN = "<!-- presets: made by `python -m flows.presets --write` from flows/presets/; do not edit -->"
END = "<!-- end of presets -->"
README = ROOT / "README.md"
STATUS_BEGIN = (
    "<!-- status: made by `python -m flows.presets --write` from flows/presets/ and docs/results/; "
    "do not edit -->"
)
STATUS_END = "<!-- end of status -->"
RESULTS = ROOT / "docs" / "results"
REAL_TEXT = RESULTS / "presets-on-real-text.csv"  # written by docs/results/real_text_runs.py


def table() -> str:
    """A line per card: its preset, the paper's table, its rows by the paper's names (★ in bold) with
    the figures, how compute is matched."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    lines = [
        "| preset | the paper's table | its rows (the paper's figures; ★ in bold) | metric | compute |",
        "|---|---|---|---|---|",
    ]
    for card in CARDS.values():
        rows = []
        for row in card.rows_on(params):
            name = f"**{row.name}** ★" if row.star else row.name
            rows.append(name if row.figure is None else f"{name} {card.figure(row)}")
        cells = [f"`{card.preset}`", card.source, "; ".join(rows), card.metric, card.compute]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- {name}: {words}." for name, words in COMPUTE.items())]
    return "\n".join(lines)


def research_runs() -> dict[str, list[str]]:
    """preset -> the research log's entries that name it on a `Preset:` line, newest first, each as
    its day (linked to its log), the heading's finding and the line's note in brackets."""
    runs: dict[str, list[str]] = {}
    for log in sorted(RESULTS.glob("20*.md"), reverse=True):
        for entry in ("\n" + log.read_text()).split("\n## ")[1:]:
            heading, _, body = entry.partition("\n")
            day, _, finding = heading.partition(": ")
            for line in re.findall(r"^Preset: (.+?)\.?$", body, re.MULTILINE):
                names, _, note = line.partition(" (")
                said = f"[{day}](docs/results/{log.name}): {finding}" + (f" ({note}" if note else "")
                for preset in re.findall(r"`(\w+)`", names):
                    runs.setdefault(preset, []).append(said)
    return runs


def status_table() -> str:
    """A line per card: the paper's table, its rows, its run on real text, its research runs."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    with REAL_TEXT.open(newline="") as handle:
        real = {row["preset"]: row for row in csv.DictReader(handle)}
    runs = research_runs()
    unknown = (set(real) | set(runs)) - set(CARDS)
    if unknown:
        raise SystemExit(f"docs/results name presets that no card has: {', '.join(sorted(unknown))}")
    lines = [
        "| preset | the paper's table | rows | on real text | research runs: the finding |",
        "|---|---|---:|---|---|",
    ]
    for card in CARDS.values():
        ran = real.get(card.preset)
        smoke = "not yet" if ran is None else f"{ran['day']}, {ran['points']} points, {ran['minutes']} min"
        found = "<br>".join(runs.get(card.preset, [])) or "none yet"
        cells = [f"`{card.preset}`", card.source, str(len(card.rows_on(params))), smoke, found]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def between(text: str, begin: str, end: str, made: str) -> str:
    """`text` with the part between the markers replaced by `made`."""
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{made}\n{end}{tail}"


def current(text: str) -> str:
    """docs/experiments.md's `text` with its presets table made anew."""
    return between(text, BEGIN, END, table())


def current_status(text: str) -> str:
    """README.md's `text` with its status table made anew."""
    return between(text, STATUS_BEGIN, STATUS_END, status_table())


def main(argv: list[str]) -> int:
    stale = []
    for doc, made in ((DOC, current), (README, current_status)):
        text = doc.read_text()
        fresh = made(text)
        if "--write" in argv:
            doc.write_text(fresh)
        elif fresh != text:
            stale.append(str(doc.relative_to(ROOT)))
    if stale:
        print(f"{', '.join(stale)}: made from the cards, stale: python -m flows.presets --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
