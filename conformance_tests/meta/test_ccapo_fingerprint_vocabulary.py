"""Meta-tests of what the reference's fingerprinters accept beyond the contract's grammar: the synonyms and
noise words of its vocabulary tables, and the normal forms of its web locations. The contract's clauses
(conformance_tests/test_ccapo_fingerprints.py) hold for any implementation; these hold for the reference,
whose tables a trainer's command strings meet. Expected values are written by hand.
"""
from __future__ import annotations

import pytest

from reference_impl.ccapo.fingerprints import abstract_location, fingerprint

pytestmark = pytest.mark.meta


@pytest.mark.parametrize("raw, want", [
    ("take the apple 1 from a countertop 2", "TAKE(apple, countertop)"),  # articles are noise, like prepositions
    ("put a mug 3 in/on the coffeemachine 1", "PUT(mug, coffeemachine)"),
])
def test_alfworld_drops_articles(raw, want):
    assert fingerprint(raw, domain="alfworld") == want


@pytest.mark.parametrize("raw, want", [
    ('click(x=1, y=2, id="b")', "CLICK(Pay)"),  # a synonym of tap
    ('input(id="b", text="4111 1111")', "TYPE(Pay)"),  # a synonym of type; the typed text is dropped
    ('LONG_PRESS(id="b")', "LONG_PRESS(Pay)"),  # verbs are case-blind
    ('back(direction="up")', "BACK()"),  # only a scroll keeps a direction
    ('swipe(x=3, y=4, direction="Left")', "SCROLL(left)"),
    ("home()", "HOME()"),  # the system keys take no target
    ("ENTER()", "ENTER()"),
])
def test_gui_vocabulary(raw, want):
    assert fingerprint(raw, domain="gui", labels={"b": "Pay"}) == want


@pytest.mark.parametrize("raw, want", [
    ("https://shop.example.com", "shop.example.com/"),  # no path: the root
    ("https://shop.example.com/", "shop.example.com/"),  # the root keeps its slash
    ("/checkout/", "/checkout"),  # no host: the path alone
])
def test_web_location_normal_forms(raw, want):
    assert abstract_location(raw, domain="web") == want


@pytest.mark.parametrize("raw, want", [
    ("take the red apple from a counter", "TAKE(red apple, counter)"),  # articles are noise
    ("put an apple in the box", "PUT(apple, box)"),  # "in" separates the arguments
    ("take key 2 from chest 1", "TAKE(key, chest)"),  # instance numbers are dropped
])
def test_textworld_vocabulary(raw, want):
    assert fingerprint(raw, domain="textworld") == want
