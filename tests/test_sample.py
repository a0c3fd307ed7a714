from __future__ import annotations

import json

from stages import sample
from stages.params import CleanParams
from stages.quality import failed_rule, normalize
from stages.synthetic import SyntheticLanguage, corpus


def test_sample_is_deterministic_and_marked_synthetic(workdir) -> None:
    sample.main()
    first = {p.name: p.read_bytes() for p in (workdir.path / "data/sample/corpus").iterdir()}
    sample.main()
    again = {p.name: p.read_bytes() for p in (workdir.path / "data/sample/corpus").iterdir()}
    assert first == again and len(first) == workdir.params["sample"]["files"]
    manifest = json.loads((workdir.path / "data/sample/manifest.json").read_text())
    assert manifest["synthetic"] is True
    assert 200_000 < manifest["characters"] < 1_000_000
    workdir.set("seed", 7)
    sample.main()
    assert {p.name: p.read_bytes() for p in (workdir.path / "data/sample/corpus").iterdir()} != first


def test_generated_text_passes_quality_rules_and_agrees_in_number() -> None:
    docs = corpus(seed=1, documents=100, lexicon_size=300, min_sentences=5, max_sentences=10)
    assert len(docs) == 104  # 2 exact + 2 near copies
    assert sum(failed_rule(normalize(d), CleanParams()) is None for d in docs) >= 95
    language = SyntheticLanguage(1, 300)
    verbs = set(language.lexicon.verbs)
    for doc in docs[:20]:
        for sentence in doc.split(". "):
            words = sentence.rstrip(".").lower().split()
            verb = next(w for w in words if w in verbs or w.removesuffix("s") in verbs)
            subject = words[words.index(verb) - 1]
            # a plural subject takes the bare verb, a singular one the -s form
            assert subject.endswith("s") == (verb in verbs)
