"""A small generated language for the offline default profile.

Pseudo-words built from syllables, a lexicon with nouns, verbs and adjectives (with a polarity), and a
grammar with number agreement. The text is learnable (agreement, topic-word co-occurrence) and
contains no copied text; everything that carries it is labelled synthetic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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
