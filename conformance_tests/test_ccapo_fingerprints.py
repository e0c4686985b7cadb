"""CCAPO §3.1 / §5.2.1: abstract action fingerprints (pluggable per domain) and contextual anchors."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_equal, assert_rejects, assert_that

LABELS = {"btn_x9z": "Submit", "btn_q1": "Cancel"}


@pytest.mark.clause("CCAPO-FP-1")
def test_alfworld_golden(ccapo):
    # the document's own example (§3.1)
    assert_equal(ccapo.fingerprint("put apple 1 in fridge 2", domain="alfworld"), "PUT(apple, fridge)", "CCAPO-FP-1")


@pytest.mark.clause("CCAPO-FP-1")
@pytest.mark.parametrize("template, want", st_.ALFWORLD_GRAMMAR)
def test_alfworld_every_command_of_the_grammar(ccapo, template, want):
    cmd = template.format(o="apple", r="countertop", k="knife", i=3, j=12)
    assert_equal(ccapo.fingerprint(cmd, domain="alfworld"), want.format(o="apple", r="countertop", k="knife"),
                 "CCAPO-FP-1", f"for {cmd!r}")


@pytest.mark.clause("CCAPO-FP-1", "CCAPO-FP-3")
@given(st_.ccapo_alfworld_commands())
def test_alfworld_drops_instance_numbers(ccapo, case):
    cmd, want = case
    assert_equal(ccapo.fingerprint(cmd, domain="alfworld"), want, "CCAPO-FP-1", f"for {cmd!r}")


@pytest.mark.clause("CCAPO-FP-2")
def test_gui_golden(ccapo):
    # §3.1: tap(x=500, y=800, id="btn_x9z") -> CLICK(Submit), the label coming from the id->label map
    got = ccapo.fingerprint('tap(x=500, y=800, id="btn_x9z")', domain="gui", labels=LABELS)
    assert_equal(got, "CLICK(Submit)", "CCAPO-FP-2")


@pytest.mark.clause("CCAPO-FP-2", "CCAPO-FP-3")
@given(st_.ccapo_gui_taps())
def test_gui_ignores_coordinates_and_ids(ccapo, case):
    action, labels, want = case
    assert_equal(ccapo.fingerprint(action, domain="gui", labels=labels), want, "CCAPO-FP-2", f"for {action!r}")


@pytest.mark.clause("CCAPO-FP-2")
def test_gui_same_label_different_ids_share_a_node(ccapo):
    a = ccapo.fingerprint('tap(x=1, y=2, id="a1")', domain="gui", labels={"a1": "Pay"})
    b = ccapo.fingerprint('tap(x=900, y=20, id="zz")', domain="gui", labels={"zz": "Pay"})
    assert_equal(a, b, "CCAPO-FP-2", "one button, two builds")


@pytest.mark.clause("CCAPO-FP-2")
@pytest.mark.parametrize("written, eid", [
    ('"X9"', "X9"), ('"x_"', "x_"), ('"\'q\'"', "'q'"), ('"9X"', "9X"), ('""', ""), ("b7", "b7"), ("X9X", "X9X"),
], ids=["leading-X", "trailing-underscore", "inner-quotes", "trailing-X", "empty", "unquoted", "unquoted-X"])
def test_gui_id_is_read_verbatim_between_its_quotes(ccapo, written, eid):
    """Only the quotes around an id are syntax: the id's own characters, whatever they are, name the element;
    an id written without quotes is read as it stands."""
    got = ccapo.fingerprint(f"tap(x=1, y=2, id={written})", domain="gui", labels={eid: "Pay"})
    assert_equal(got, "CLICK(Pay)", "CCAPO-FP-2", f"the label of id {written}")


@pytest.mark.clause("CCAPO-FP-3")
def test_domains_are_dispatched(ccapo):
    assert_equal(ccapo.fingerprint("open fridge 1", domain="alfworld"), "OPEN(fridge)", "CCAPO-FP-3")
    assert_equal(ccapo.fingerprint("back()", domain="gui", labels={}), "BACK()", "CCAPO-FP-3")


@pytest.mark.clause("CCAPO-ANCHOR-1")
def test_anchor_golden(ccapo):
    assert_equal(list(ccapo.anchor("kitchen", "PUT(apple, fridge)")), ["kitchen", "PUT(apple, fridge)"], "CCAPO-ANCHOR-1")
    assert_equal(list(ccapo.anchor("kitchen", None)), ["kitchen", "<START>"], "CCAPO-ANCHOR-1", "t = 0")


@pytest.mark.clause("CCAPO-ANCHOR-1")
@pytest.mark.parametrize("raw, domain, want", [
    ("https://shop.example.com/cart/?id=3#top", "web", "shop.example.com/cart"),
    ("http://shop.example.com/cart?id=9", "web", "shop.example.com/cart"),
    ("shop.example.com/cart/", "web", "shop.example.com/cart"),  # no scheme: still host + path
    ("https://shop.example.com/BOX/", "web", "shop.example.com/BOX"),  # the path's case is kept
    ("https://user:pw@shop.example.com:8443/cart?id=1", "web", "shop.example.com/cart"),  # the host: no port, no login
    ("com.app.CheckoutActivity", "android", "com.app.CheckoutActivity"),
    ("kitchen", "alfworld", "kitchen"),
])
def test_abstract_location(ccapo, raw, domain, want):
    got = ccapo.abstract_location(raw, domain=domain)
    path_ends_in_slash = raw.split("#")[0].split("?")[0].endswith("/")
    if domain == "web" and path_ends_in_slash and got == want + "/":  # the URL path as written (CCAPO-ANCHOR-1)
        return
    assert_equal(got, want, "CCAPO-ANCHOR-1", f"{domain}: {raw!r}")


@pytest.mark.clause("CCAPO-INPUT-4")
@pytest.mark.parametrize("action, domain, labels", [
    ("put apple 1 in fridge 2", "minecraft", None),
    ('tap(x=5, y=8, id="btn_unknown")', "gui", LABELS),
    ("tap(x=5, y=8)", "gui", LABELS),
    ('tap(x=5, y=8, id="btn_q1")', "gui", None),  # an id but no id -> label map at all
    ("tap x=5, y=8", "gui", LABELS),  # not a call
    ("fly(x=5, y=8)", "gui", LABELS),  # a call of no GUI verb
    ("fly to moon 1", "alfworld", None),
])
def test_unknown_domain_or_label_is_rejected(ccapo, action, domain, labels):
    assert_rejects("CCAPO-INPUT-4", ccapo.raw("fingerprint"), action, domain=domain, labels=labels)


@pytest.mark.clause("CCAPO-FP-2", "CCAPO-FP-3")
@given(st_.ccapo_gui_actions())
def test_gui_every_targeted_verb_resolves_the_label_and_drops_the_noise(ccapo, case):
    verb, a, b, labels, label = case
    fa = ccapo.fingerprint(a, domain="gui", labels=labels)
    fb = ccapo.fingerprint(b, domain="gui", labels=labels)
    assert_equal(fa, fb, "CCAPO-FP-3", f"{a!r} and {b!r} differ only in coordinates, ids or typed text")
    assert_that(fa.endswith(f"({label})"), "CCAPO-FP-2", fa, f"VERB({label}): the element's label as the argument")
    if verb == "tap":
        assert_equal(fa, f"CLICK({label})", "CCAPO-FP-2", "a tap is a CLICK")


@pytest.mark.clause("CCAPO-FP-2")
@given(st.sampled_from(["Submit", "Search"]), st.integers(0, 2000), st.integers(0, 2000))
def test_gui_verbs_on_one_element_stay_distinct(ccapo, label, x, y):
    """tap, long-press and type on the same element are different actions: one node each."""
    labels = {"el_1": label}
    got = {ccapo.fingerprint(t, domain="gui", labels=labels) for t in (
        f'tap(x={x}, y={y}, id="el_1")', f'long_press(x={x}, y={y}, id="el_1", duration=800)',
        f'type(text="hello {x}", id="el_1")')}
    assert_that(len(got) == 3, "CCAPO-FP-2", sorted(got), "three distinct fingerprints (the verb is kept)")


@pytest.mark.clause("CCAPO-FP-2", "CCAPO-FP-3")
@given(st_.ccapo_gui_moves())
def test_gui_swipe_and_scroll_keep_the_direction_and_drop_coordinates(ccapo, case):
    verb, direction, a, b = case
    fa, fb = (ccapo.fingerprint(t, domain="gui", labels={}) for t in (a, b))
    assert_equal(fa, fb, "CCAPO-FP-3", f"{a!r} and {b!r} differ only in coordinates")
    assert_that(not any(ch.isdigit() for ch in fa), "CCAPO-FP-3", fa, "no coordinates in the fingerprint")
    others = {ccapo.fingerprint(a.replace(f'"{direction}"', f'"{d}"'), domain="gui", labels={})
              for d in st_.GUI_DIRECTIONS}
    assert_that(len(others) == len(st_.GUI_DIRECTIONS), "CCAPO-FP-2", sorted(others),
                f"one fingerprint per {verb} direction")
