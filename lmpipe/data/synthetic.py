"""A small generated language for the offline default profile.

Pseudo-words built from syllables, a lexicon with nouns, verbs and adjectives (with a polarity), and a
grammar with number agreement. The text is learnable (agreement, topic-word co-occurrence) and
contains no copied text; everything that carries it is labelled synthetic.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "l", "m", "k"]
DETERMINERS_SINGULAR = ["the", "a", "every", "this"]
DETERMINERS_PLURAL = ["the", "some", "many", "these"]
PREPOSITIONS = ["near", "under", "with", "beyond", "behind"]
CONJUNCTIONS = ["and", "but", "while", "because"]


@dataclass(frozen=True)
class Lexicon:
    nouns: tuple[str, ...]
    verbs: tuple[str, ...]
    positive: tuple[str, ...]
    negative: tuple[str, ...]


def _pseudo_word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def make_lexicon(seed: int, size: int) -> Lexicon:
    rng = random.Random(f"lexicon-{seed}")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        word = _pseudo_word(rng, rng.choice((1, 2, 2, 3)))
        # stems ending in "s" would make plurals and 3rd-person forms ambiguous
        if len(word) >= 3 and not word.endswith("s") and word not in seen:
            seen.add(word)
            words.append(word)
    n_nouns, n_verbs = size // 2, size // 4
    n_adj = (size - n_nouns - n_verbs) // 2
    adjectives = words[n_nouns + n_verbs :]
    return Lexicon(
        nouns=tuple(words[:n_nouns]),
        verbs=tuple(words[n_nouns : n_nouns + n_verbs]),
        positive=tuple(adjectives[:n_adj]),
        negative=tuple(adjectives[n_adj : 2 * n_adj]),
    )


class SyntheticLanguage:
    def __init__(self, seed: int, lexicon_size: int) -> None:
        self.lexicon = make_lexicon(seed, lexicon_size)

    def noun_phrase(self, rng: random.Random, topic: list[str], plural: bool) -> str:
        lex = self.lexicon
        det = rng.choice(DETERMINERS_PLURAL if plural else DETERMINERS_SINGULAR)
        noun = rng.choice(topic) if rng.random() < 0.7 else rng.choice(lex.nouns)
        words = [det]
        if rng.random() < 0.5:
            words.append(rng.choice(lex.positive if rng.random() < 0.5 else lex.negative))
        words.append(noun + ("s" if plural else ""))
        if det == "a" and words[1][0] in "aeiou":
            words[0] = "an"
        return " ".join(words)

    def clause(self, rng: random.Random, topic: list[str]) -> str:
        plural = rng.random() < 0.4
        subject = self.noun_phrase(rng, topic, plural)
        verb = rng.choice(self.lexicon.verbs) + ("" if plural else "s")
        obj = self.noun_phrase(rng, topic, rng.random() < 0.4)
        clause = f"{subject} {verb} {obj}"
        if rng.random() < 0.3:
            clause += f" {rng.choice(PREPOSITIONS)} {self.noun_phrase(rng, topic, rng.random() < 0.4)}"
        return clause

    def sentence(self, rng: random.Random, topic: list[str]) -> str:
        text = self.clause(rng, topic)
        if rng.random() < 0.25:
            text += f" {rng.choice(CONJUNCTIONS)} {self.clause(rng, topic)}"
        return text[0].upper() + text[1:] + "."

    def document(self, rng: random.Random, sentences: int) -> str:
        topic = rng.sample(self.lexicon.nouns, k=min(6, len(self.lexicon.nouns)))
        return " ".join(self.sentence(rng, topic) for _ in range(sentences))


def corpus(seed: int, documents: int, lexicon_size: int, min_sentences: int, max_sentences: int) -> list[str]:
    """Documents of the sample corpus, with a few exact and near duplicates for `clean` to find."""
    language = SyntheticLanguage(seed, lexicon_size)
    rng = random.Random(f"corpus-{seed}")
    docs = [language.document(rng, rng.randint(min_sentences, max_sentences)) for _ in range(documents)]
    for i in range(0, documents, 50):  # 2 % exact copies, 2 % near copies (one word changed)
        docs.append(docs[i])
        words = docs[i + 1 if i + 1 < documents else i].split()
        words[rng.randrange(len(words))] = rng.choice(language.lexicon.nouns)
        docs.append(" ".join(words))
    rng.shuffle(docs)
    return docs


class TaskLayout(NamedTuple):
    """How one synthetic task is generated and written as a GLUE TSV file."""

    make: Callable[[random.Random], tuple]  # one example from a seeded stream
    header: str
    row: Callable[[int, tuple], str]  # (index, example) -> one line without its newline
    final_newline: bool = True

    def text(self, examples: Iterable[tuple]) -> str:
        body = "\n".join(self.row(i, example) for i, example in enumerate(examples))
        return self.header + body + ("\n" if self.final_newline else "")


def glue_files(seed: int, lexicon_size: int, train_rows: int, dev_rows: int) -> dict[str, dict[str, str]]:
    """Small GLUE-like tasks in the original TSV layout, with labels that follow from the generated
    language (so they can be learned): folder -> file name -> contents. Each task draws from its own
    seeded stream, so changing one task's generator leaves the others' rows as they were."""
    language = SyntheticLanguage(seed, lexicon_size)
    lex = language.lexicon
    verbs = set(lex.verbs)
    adjectives = set(lex.positive + lex.negative)

    def topic(rng: random.Random) -> list[str]:
        return rng.sample(lex.nouns, k=6)

    def sentiment(rng: random.Random) -> tuple[str, int]:
        label = rng.randrange(2)
        polar = lex.positive if label else lex.negative
        words = language.clause(rng, topic(rng)).split()
        nouns = [i for i, w in enumerate(words) if w.rstrip("s") in lex.nouns or w in lex.nouns]
        for i in reversed(nouns):  # an adjective of the label's polarity before every noun
            words.insert(i, rng.choice(polar))
        return " ".join(w for w in words if w not in adjectives or w in polar) + " .", label

    def acceptability(rng: random.Random) -> tuple[str, int]:
        words = language.sentence(rng, topic(rng)).split()
        label = rng.randrange(2)
        if not label:  # break the number agreement of the first verb
            i = next(i for i, w in enumerate(words) if w in verbs or w[:-1] in verbs)
            words[i] = words[i][:-1] if words[i] not in verbs else words[i] + "s"
        return " ".join(words), label

    def entailment(rng: random.Random) -> tuple[str, str, str]:
        t = topic(rng)
        first, second = language.clause(rng, t), language.clause(rng, t)
        premise = f"{first[0].upper()}{first[1:]} and {second}."
        label = rng.randrange(2)
        hypothesis = rng.choice((first, second)) if label == 0 else language.clause(rng, t)
        return premise, f"{hypothesis[0].upper()}{hypothesis[1:]}.", ("entailment", "not_entailment")[label]

    def similar(rng: random.Random) -> tuple[str, str, float]:
        words = language.sentence(rng, topic(rng)).split()
        other = list(words)
        for i in rng.sample(range(len(other)), k=rng.randrange(len(other) + 1)):
            other[i] = rng.choice(lex.nouns)
        overlap = len(set(words) & set(other)) / len(set(words) | set(other))
        return " ".join(words), " ".join(other), round(5 * overlap, 3)

    def paraphrase(rng: random.Random) -> tuple[str, str, int]:
        # a paraphrase restates the first sentence without its adjectives; a non-paraphrase (like a
        # dissimilar STS-B pair) has half of its words replaced by other nouns
        first = language.sentence(rng, topic(rng))
        words = [w for w in first.split() if w.strip(".") not in adjectives]
        label = rng.randrange(2)
        if not label:
            for i in rng.sample(range(len(words)), k=len(words) // 2):
                words[i] = rng.choice(lex.nouns)
        return first, " ".join(words), label

    layouts = {  # GLUE's own: a header line (none in CoLA) and columns in GLUE's order
        "SST-2": TaskLayout(sentiment, "sentence\tlabel\n", lambda i, e: f"{e[0]} \t{e[1]}"),
        "CoLA": TaskLayout(
            acceptability,
            "",
            lambda i, e: f"syn{i % 7:02d}\t{e[1]}\t{'' if e[1] else '*'}\t{e[0]}",
            final_newline=False,  # as GLUE's CoLA files
        ),
        "RTE": TaskLayout(
            entailment, "index\tsentence1\tsentence2\tlabel\n", lambda i, e: f"{i}\t{e[0]}\t{e[1]}\t{e[2]}"
        ),
        "STS-B": TaskLayout(
            similar,
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n",
            lambda i, e: f"{i}\tsynthetic\tsample\t2026\t{i:04d}\tnone\tnone\t{e[0]}\t{e[1]}\t{e[2]:.3f}",
        ),
        "MRPC": TaskLayout(
            paraphrase,
            "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n",
            lambda i, e: f"{e[2]}\t{2 * i}\t{2 * i + 1}\t{e[0]}\t{e[1]}",
        ),
    }
    files: dict[str, dict[str, str]] = {}
    for folder, layout in layouts.items():
        rng = random.Random(f"glue-{folder}-{seed}")
        files[folder] = {
            f"{split}.tsv": layout.text(layout.make(rng) for _ in range(rows))
            for split, rows in (("train", train_rows), ("dev", dev_rows))
        }
    return files
