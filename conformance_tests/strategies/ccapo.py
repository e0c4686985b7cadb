"""Strategies of the ccapo family: STDB counts, trajectories, return groups, step batches, actions."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

from conformance_tests import harness
from conformance_tests.strategies.core import declared_dtype

__all__ = [
    "ccapo_edge_counts", "ccapo_global_counts", "ccapo_trajectories", "ccapo_streams",
    "ccapo_return_groups", "ccapo_fingerprint_seqs", "ccapo_step_batches", "ccapo_alfworld_commands",
    "ccapo_gui_taps", "ccapo_logp_batches", "ccapo_gui_actions", "ccapo_gui_moves", "ALFWORLD_GRAMMAR",
    "GUI_TARGETED", "GUI_DIRECTIONS",
]

_LOCS = ("kitchen", "hall", "bedroom")
_FPS = ("GOTO(kitchen)", "GOTO(hall)", "TAKE(key)", "OPEN(chest)")


@st.composite
def ccapo_edge_counts(draw, *, max_len: int = 8, max_count: int = 50):
    """(n_succ, n_total) int64 tensors of one length with 0 <= n_succ <= n_total."""
    n = draw(st.integers(1, max_len))
    tot = draw(st.lists(st.integers(0, max_count), min_size=n, max_size=n))
    suc = [draw(st.integers(0, t)) for t in tot]
    return torch.tensor(suc, dtype=torch.int64), torch.tensor(tot, dtype=torch.int64)


@st.composite
def ccapo_global_counts(draw, *, max_count: int = 500):
    """(n_succ_total, n_total_global) with 0 <= n_succ_total <= n_total_global."""
    tot = draw(st.integers(0, max_count))
    return draw(st.integers(0, tot)), tot


# Keys that collide under a naive store key: "kit" + "chenGOTO(a)" == "kitchen" + "GOTO(a)" when the
# parts are concatenated, a separator inside a part, case and trailing-space twins, non-ASCII.
_TRICKY_LOCS = ("kit", "kitchen", "Kitchen", "kitchen ", "a|b", "a", "厨房")
_TRICKY_FPS = ("GOTO(a)", "chenGOTO(a)", "GOTO(a|b)", "b|GOTO(a)", "TAKE(key)", "take(key)", "<START>x")


@st.composite
def ccapo_trajectories(draw, *, max_len: int = 8):
    """A finished trajectory over a tiny vocabulary (so edges repeat), anchors chained as in §5.2.1.
    Some draw from keys that collide when their parts are concatenated or case-folded."""
    T = draw(st.integers(1, max_len))
    tricky = draw(st.integers(0, 2)) == 0
    locs = draw(st.lists(st.sampled_from(_TRICKY_LOCS if tricky else _LOCS), min_size=T, max_size=T))
    fps = draw(st.lists(st.sampled_from(_TRICKY_FPS if tricky else _FPS), min_size=T, max_size=T))
    anchors = [(loc, "<START>" if t == 0 else fps[t - 1]) for t, loc in enumerate(locs)]
    return {"anchors": anchors, "fingerprints": fps, "success": draw(st.booleans())}


def ccapo_streams(*, max_size: int = 12):
    """A list of trajectories fed to the STDB in order."""
    return st.lists(ccapo_trajectories(), min_size=1, max_size=max_size)


def ccapo_return_groups(*, max_groups: int = 4, max_n: int = 8):
    """[G, N] float64 returns on the R_tau grid (success or not, 1..50 steps), so ties are common."""
    @st.composite
    def build(draw):
        # min_group_size: a library that rejects single-member groups gets groups of two or more
        smallest = 2 if harness.convention("min_group_size", record=False) == 2 else 1
        if smallest == 2:  # the draw itself follows the declaration ("raw" draws like the seed)
            harness.convention("min_group_size")
        G, N = draw(st.integers(1, max_groups)), draw(st.integers(smallest, max_n))
        succ = draw(st.lists(st.booleans(), min_size=G * N, max_size=G * N))
        steps = draw(st.lists(st.integers(1, 50), min_size=G * N, max_size=G * N))
        r = torch.tensor([10.0 * s - 0.1 * k for s, k in zip(succ, steps)], dtype=declared_dtype(torch.float64)).reshape(G, N)
        for g in draw(st.sets(st.integers(0, G - 1), max_size=G)):  # all-equal groups, on purpose
            r[g] = r[g, 0]
        return r
    return build()


def ccapo_fingerprint_seqs(*, max_len: int = 12, vocab: int = 4):
    """[T] int64 fingerprint ids from a small vocabulary (loops are frequent)."""
    return st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_len).map(
        lambda v: torch.tensor(v, dtype=torch.int64))


@st.composite
def ccapo_step_batches(draw, *, max_b: int = 5, max_t: int = 8, scale: float = 2.0):
    """(raw [B,T] float64 with many exact zeros, valid [B,T] bool with >= 1 True)."""
    B, T = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    vals = draw(st.lists(st.one_of(st.just(0.0), st.floats(-scale, scale, allow_nan=False)),
                         min_size=B * T, max_size=B * T))
    valid = draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))
    valid[draw(st.integers(0, B * T - 1))] = True
    return torch.tensor(vals, dtype=declared_dtype(torch.float64)).reshape(B, T), torch.tensor(valid).reshape(B, T)


# Every command of the ALFWorld grammar, as the game prints it (admissible commands), with its
# fingerprint: verb upper-cased ("go to" -> GOTO), instance numbers and prepositions dropped.
ALFWORLD_GRAMMAR = (
    ("go to {r} {j}", "GOTO({r})"), ("take {o} {i} from {r} {j}", "TAKE({o}, {r})"),
    ("put {o} {i} in/on {r} {j}", "PUT({o}, {r})"), ("put {o} {i} in {r} {j}", "PUT({o}, {r})"),
    ("put {o} {i} on {r} {j}", "PUT({o}, {r})"), ("open {r} {j}", "OPEN({r})"), ("close {r} {j}", "CLOSE({r})"),
    ("toggle {o} {i}", "TOGGLE({o})"), ("clean {o} {i} with {r} {j}", "CLEAN({o}, {r})"),
    ("heat {o} {i} with {r} {j}", "HEAT({o}, {r})"), ("cool {o} {i} with {r} {j}", "COOL({o}, {r})"),
    ("slice {o} {i} with {k} {j}", "SLICE({o}, {k})"), ("examine {o} {i}", "EXAMINE({o})"),
    ("examine {r} {j}", "EXAMINE({r})"), ("use {o} {i}", "USE({o})"), ("look", "LOOK()"),
    ("inventory", "INVENTORY()"),
)
_ALF = st.sampled_from(ALFWORLD_GRAMMAR)


@st.composite
def ccapo_alfworld_commands(draw):
    """(command, expected fingerprint): any command of the grammar, random object types and instance
    numbers (1..99, the same number on both sides included)."""
    tpl, fp = draw(_ALF)
    o = draw(st.sampled_from(["apple", "mug", "egg", "desklamp", "creditcard", "soapbottle"]))
    r = draw(st.sampled_from(["fridge", "countertop", "microwave", "cabinet", "sinkbasin", "drawer"]))
    k = draw(st.sampled_from(["knife", "butterknife"]))
    i, j = draw(st.integers(1, 99)), draw(st.integers(1, 99))
    return tpl.format(o=o, r=r, k=k, i=i, j=j), fp.format(o=o, r=r, k=k)


# The GUI domain's action forms: targeted verbs name an element (its id resolved through labels),
# the others carry coordinates and possibly a direction.
GUI_TARGETED = ("tap", "long_press", "type")
GUI_DIRECTIONS = ("up", "down", "left", "right")


def _gui_text(verb: str, eid: str, g) -> str:
    x, y, x2, y2 = (int(v) for v in g.integers(0, 3000, 4))
    if verb == "tap":
        return f'tap(x={x}, y={y}, id="{eid}")'
    if verb == "long_press":
        return f'long_press(x={x}, y={y}, id="{eid}", duration={int(g.integers(300, 2000))})'
    if verb == "type":
        return f'type(text="{"".join(g.choice(list("abc xyz123"), int(g.integers(0, 12))))}", id="{eid}")'
    raise ValueError(verb)


@st.composite
def ccapo_gui_actions(draw):
    """(verb, two action texts that differ only in coordinates, ids and typed text, labels, label) for
    every targeted GUI verb: tap, long-press and type."""
    verb = draw(st.sampled_from(GUI_TARGETED))
    label = draw(st.sampled_from(["Submit", "Cancel", "Search", "Next", "Email"]))
    ids = draw(st.lists(st.from_regex(r"[a-z]{2,4}_[a-z0-9]{1,5}", fullmatch=True), min_size=2, max_size=2))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels = {ids[0]: label, ids[1]: label, "other_id": "Back"}
    return verb, _gui_text(verb, ids[0], g), _gui_text(verb, ids[1], g), labels, label


@st.composite
def ccapo_gui_moves(draw):
    """(verb, direction, two swipe/scroll texts in that direction with different coordinates)."""
    verb, d = draw(st.sampled_from(["swipe", "scroll"])), draw(st.sampled_from(GUI_DIRECTIONS))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def text():
        x1, y1, x2, y2 = (int(v) for v in g.integers(0, 3000, 4))
        if verb == "swipe":
            return f'swipe(x1={x1}, y1={y1}, x2={x2}, y2={y2}, direction="{d}")'
        return f'scroll(x={x1}, y={y1}, direction="{d}")'

    return verb, d, text(), text()


@st.composite
def ccapo_gui_taps(draw):
    """(action text, labels, expected fingerprint): a tap anywhere on a labelled element."""
    eid = draw(st.from_regex(r"btn_[a-z0-9]{3,6}", fullmatch=True))
    label = draw(st.sampled_from(["Submit", "Cancel", "Search", "Next"]))
    x, y = draw(st.integers(0, 2000)), draw(st.integers(0, 3000))
    return f'tap(x={x}, y={y}, id="{eid}")', {eid: label, "other": "Back"}, f"CLICK({label})"


@st.composite
def ccapo_logp_batches(draw, *, max_b: int = 4, max_t: int = 6):
    """(logp_new, logp_old, logp_ref, adv, mask) [B,T] float64 / bool, >= 1 real step per row."""
    B, T = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    def arr(lo, hi):
        return np.array(draw(st.lists(st.floats(lo, hi, allow_nan=False), min_size=B * T, max_size=B * T)))
    old = arr(-3.0, -0.05)
    new = old + arr(-0.5, 0.5)
    ref = old + arr(-0.5, 0.5)
    adv = arr(-3.0, 3.0)
    lens = [draw(st.integers(1, T)) for _ in range(B)]
    mask = np.array([[t < n for t in range(T)] for n in lens])
    t = lambda a: torch.tensor(a.reshape(B, T), dtype=declared_dtype(torch.float64))  # noqa: E731
    return t(new), t(old), t(ref), t(adv), torch.tensor(mask)
