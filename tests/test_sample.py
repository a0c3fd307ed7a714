from __future__ import annotations

import json

from lmpipe.data.quality import failed_rule, normalize
from lmpipe.data.synthetic import SyntheticLanguage, corpus
from lmpipe.params.clean import CleanParams
from stages import sample


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


def test_each_synthetic_task_has_its_own_stream_and_mrpc_labels_follow_the_words() -> None:
    from lmpipe.data.synthetic import glue_files

    small, large = glue_files(7, 300, 50, 20), glue_files(7, 300, 50, 40)
    # one task's rows do not depend on how many rows another drew before it
    assert small["SST-2"]["train.tsv"] == large["SST-2"]["train.tsv"]
    assert large["CoLA"]["dev.tsv"].startswith(small["CoLA"]["dev.tsv"])
    assert not small["CoLA"]["dev.tsv"].endswith("\n")  # GLUE's CoLA files end without one
    rows = [line.split("\t") for line in large["MRPC"]["train.tsv"].splitlines()[1:]]
    assert {label for label, *_ in rows} == {"0", "1"}
    for label, _, _, first, second in rows:
        # a paraphrase only drops words (the adjectives); a non-paraphrase brings in other ones
        new_words = set(second.split()) - set(first.split())
        assert (not new_words) == (label == "1"), (label, first, second)
