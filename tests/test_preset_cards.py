"""Every preset's card on every profile: its paper and table, one ★ row, distinct row names, and every
row a valid point, an equal-FLOPs card's rows affording their warm-up on the ★ row's budget. Apart
from tests/test_presets.py so that the two files run on two workers: this one validates every row of
every card three times."""

from __future__ import annotations

import re
from pathlib import Path

from flows.ablation import equal_flops_budget, planned
from flows.presets import CARDS, card_lines
from flows.sweep import point_overrides
from tests.workdir import DEFAULT_PARAMS, ROOT


def test_every_card_names_its_table_and_its_rows_validate_on_every_profile(tmp_path: Path) -> None:
    """Every card: its paper (with the year), its table or figure, one ★ row, distinct row names, its
    figures' source; every row a valid point on the offline default and on every profile; an
    equal-FLOPs card's rows all afford their warm-up on the ★ row's budget."""
    from flows import profile as profiles

    (tmp_path / "SST-2").mkdir()  # a GLUE folder with a task in it
    on_profiles = {"params.yaml": []}
    on_profiles |= {
        name: profiles.overrides(name, str(tmp_path), str(tmp_path)) for name in profiles.available()
    }
    applied = {
        profile: profiles.applied(ROOT, on_profile, profile) for profile, on_profile in on_profiles.items()
    }
    for card in CARDS.values():
        assert re.search(r"\(.+, (19|20)\d\d\)", card.paper), card.paper
        assert card.table and card.metric and card.figures_from and card.compares, card.preset
        for profile, on_profile in on_profiles.items():
            params = applied[profile]
            rows = card.rows_on(params)
            assert len({row.name for row in rows}) == len(rows) and sum(row.star for row in rows) == 1
            plan = planned(card.preset, None, params)
            assert rows[plan.base].star
            validated = [
                profiles.validate(
                    ROOT, [*on_profile, *point_overrides(p, params, ROOT / "params.yaml")], profile
                )
                for p in plan.values
            ]
            if plan.equal_flops:
                equal_flops_budget(validated, plan.base)
        assert any(line.startswith("| 1 |") for line in card_lines(card, card.rows_on(DEFAULT_PARAMS)))
