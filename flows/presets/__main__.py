"""docs/experiments.md's table of presets, made from the cards: `python -m flows.presets --write`
rewrites it, `python -m flows.presets` says whether it is current (tests/test_presets.py runs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from flows.presets import CARDS, COMPUTE

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "experiments.md"
BEGIN = "<!-- presets: made by `python -m flows.presets --write` from flows/presets/; do not edit -->"
END = "<!-- end of presets -->"


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
            rows.append(name if row.figure is None else f"{name} {row.figure:g}")
        cells = [f"`{card.preset}`", card.source, "; ".join(rows), card.metric, card.compute]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *(f"- {name}: {words}." for name, words in COMPUTE.items())]
    return "\n".join(lines)


def current(text: str) -> str:
    """`text` with the part between the markers made anew."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    made = current(text)
    if "--write" in argv:
        DOC.write_text(made)
        return 0
    if made != text:
        print(f"{DOC.relative_to(ROOT)}: its presets table is stale: python -m flows.presets --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
