"""Synthetic encyclopedic facts about invented entities.

The entities are structured records (`make_entities`) so that later stages can ask
questions about them (SFT conversations, evaluation tasks) and check the answers; the
pretraining documents are short encyclopedic paragraphs rendered from those records with
varied templates, so the model must learn the facts rather than one sentence shape.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from stagewise.data.world._common import rng_for

KINDS = ["town", "city", "village", "harbour", "guild", "monastery", "observatory",
         "university", "trading company", "island"]
COLOURS = ["red", "blue", "green", "amber", "violet", "teal", "ochre", "silver", "crimson",
           "indigo", "white", "black", "saffron", "olive", "scarlet", "grey"]
SYMBOLS = ["heron", "fox", "owl", "stag", "salmon", "wolf", "lynx", "crane", "bear", "hare",
           "falcon", "otter", "beetle", "swan", "boar", "raven"]
_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "kr", "st", "th", "sh", "gl", "tr", "ch", "qu"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "x"]


@dataclass(frozen=True)
class Entity:
    """One invented entity; every field is a fact a question can ask about."""

    name: str
    kind: str
    founded: int
    location: str
    population: int
    colour: str
    symbol: str
    founder: str

    def attributes(self) -> dict[str, str | int]:
        """The fields as a plain dict (for building questions and answers)."""
        return asdict(self)


def invent_word(rng: random.Random, syllables: int) -> str:
    """A pronounceable invented word, capitalised."""
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
    return (word + rng.choice(_CODAS)).capitalize()


def _unique_words(rng: random.Random, n: int, lo: int, hi: int, taken: set[str]) -> list[str]:
    words = []
    while len(words) < n:
        word = invent_word(rng, rng.randint(lo, hi))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def make_entities(n: int, seed: int) -> list[Entity]:
    """`n` entities with unique names, deterministic from the seed (the same list every call)."""
    rng = rng_for(seed, "entities")
    taken: set[str] = set()
    regions = _unique_words(rng, max(8, n // 40), 2, 3, taken)
    names = _unique_words(rng, n, 2, 4, taken)
    people = [f"{a} {b}" for a, b in zip(_unique_words(rng, n, 2, 2, taken), _unique_words(rng, n, 2, 3, taken))]
    entities = []
    for name, founder in zip(names, people):
        kind = rng.choice(KINDS)
        small = kind in ("guild", "monastery", "observatory", "village")
        entities.append(Entity(
            name=name, kind=kind, founded=rng.randint(800, 2010), location=rng.choice(regions),
            population=rng.randint(20, 5_000) if small else rng.randint(1_000, 2_000_000),
            colour=rng.choice(COLOURS), symbol=rng.choice(SYMBOLS), founder=founder,
        ))
    return entities


_FOUNDED = ["It was founded in {founded} by {founder}.", "{founder} founded it in {founded}.",
            "Its history begins in {founded}, when {founder} established it."]
_POPULATION = ["It has a population of {population:,}.", "About {population:,} people belong to it.",
               "Its population is {population:,}."]
_COLOUR = ["Its official colour is {colour}.", "The colour of {name} is {colour}.",
           "{name} is associated with the colour {colour}."]
_SYMBOL = ["Its emblem is the {symbol}.", "The {symbol} appears on the emblem of {name}.",
           "{name} has the {symbol} as its symbol."]
_INTRO = ["{name} is {a_kind} in {location}.", "{name} is {a_kind} located in the region of {location}.",
          "In the region of {location} lies {name}, {a_kind}."]


def render_entity(entity: Entity, rng: random.Random) -> str:
    """An encyclopedic paragraph: an introduction, then the other facts in a random order."""
    fields = entity.attributes()
    fields["a_kind"] = ("an " if entity.kind[0] in "aeiou" else "a ") + entity.kind
    body = [rng.choice(t).format(**fields) for t in (_FOUNDED, _POPULATION, _COLOUR, _SYMBOL)]
    rng.shuffle(body)
    return " ".join([rng.choice(_INTRO).format(**fields), *body])


def fact_texts(n: int, seed: int) -> list[str]:
    """One paragraph per entity of `make_entities(n, seed)`."""
    rng = rng_for(seed, "facts-render")
    return [render_entity(e, rng) for e in make_entities(n, seed)]
