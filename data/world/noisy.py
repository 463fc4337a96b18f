"""Low-quality text, so that quality tiers mean something in blends.

Each document is a clean encyclopedic paragraph (from entities of its own) damaged in one
of the ways web text is damaged: words shuffled, a phrase repeated, random character junk,
or buried in navigation and legal boilerplate.
"""

from __future__ import annotations

import random
import string

from stagewise.data.world._common import rng_for
from stagewise.data.world.facts import make_entities, render_entity

BOILERPLATE = [
    "Home | About | Contact | Privacy Policy | Terms of Use",
    "We use cookies to improve your experience. By continuing you accept our cookie policy.",
    "Subscribe to our newsletter for the latest updates!",
    "All rights reserved. Reproduction without permission is prohibited.",
    "Click here to read more. Share on social media. Sign in to comment.",
    "Page 1 of 12 | Next >> | Last >>",
]
PHRASES = ["best price guaranteed", "click here now", "limited offer", "read more", "top 10 facts"]


def shuffled_words(text: str, rng: random.Random) -> str:
    """The same words in a random order (fluent vocabulary, no syntax)."""
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def repeated_phrase(text: str, rng: random.Random) -> str:
    """A spam phrase (or the text's own first sentence) repeated 5-30 times before the text."""
    phrase = rng.choice(PHRASES + text.split(". ")[:2])
    return " ".join([phrase] * rng.randint(5, 30)) + " " + text


def char_junk(text: str, rng: random.Random) -> str:
    """Random character junk spliced into the text at a random point."""
    alphabet = string.ascii_letters + string.digits + string.punctuation
    junk = ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(rng.randint(20, 120))]
    cut = rng.randint(0, len(text))
    return text[:cut] + " " + " ".join(junk) + " " + text[cut:]


def boilerplate(text: str, rng: random.Random) -> str:
    """A truncated text between navigation, cookie and legal lines."""
    head = rng.sample(BOILERPLATE, k=rng.randint(1, 3))
    tail = rng.sample(BOILERPLATE, k=rng.randint(1, 3))
    return "\n".join([*head, text[: rng.randint(20, max(21, len(text)))], *tail])


DAMAGES = [shuffled_words, repeated_phrase, char_junk, boilerplate]


def noisy_texts(n: int, seed: int) -> list[str]:
    """`n` damaged paragraphs; the damage is chosen per document from DAMAGES."""
    rng = rng_for(seed, "noisy")
    return [rng.choice(DAMAGES)(render_entity(e, rng), rng) for e in make_entities(n, seed + 1)]
