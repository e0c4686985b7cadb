"""Paragraph-level quality figures of free writing (seed 000, §10), beside SAC-COV-1's n-gram coverage.

§10 gates "段落一致性分" (the paragraph consistency score) against the leak-free baseline without
defining the score. Our operational definition, chosen so that it needs no reference text (a
leak-free writer is judged on its own paragraph) and so that a degenerate loop cannot score by
repeating one good pair:

    consistency(x) = |{distinct adjacent pairs x_i x_{i+1} of x that are words of L}| / (|x| − 1)

with L the two-character lexicon of SAC-BIGRAM-1. A paragraph that reads as a run of distinct
two-character words scores up to 1; one character repeated, or a short loop, scores near 0.
"""
from __future__ import annotations

from typing import Collection


def paragraph_consistency(text: str, lexicon: Collection[str]) -> float:
    """Share of the paragraph's adjacent pairs that are distinct lexicon words (0 for under two characters).

    Our definition of §10's consistency score (SAC-GATE-7); see the module docstring.
    """
    if len(text) < 2:
        return 0.0
    pairs = {text[i:i + 2] for i in range(len(text) - 1)}
    words = pairs & frozenset(lexicon)  # frozenset(a frozenset) is the same object: no copy of L
    return len(words) / (len(text) - 1)


def ngram_set(text: str, n: int) -> frozenset[str]:
    """Every n-gram of ``text`` (e.g. of the whole held-out split)."""
    return frozenset(text[i:i + n] for i in range(len(text) - n + 1))


def attested_share(text: str, attested: frozenset[str], n: int) -> float:
    """Share of the paragraph's n-grams (with multiplicity) found in ``attested``: SAC-COV-1's ratio with
    the whole held-out split as G instead of the one reference window (0 for fewer than n characters).

    A diagnostic for the corpus-level reading of §10's "4-gram coverage on held-out chapters"; the
    gate itself reads SAC-COV-1 against the passage's own reference.
    """
    grams = [text[i:i + n] for i in range(len(text) - n + 1)]
    return sum(g in attested for g in grams) / len(grams) if grams else 0.0
