"""Strategies of the ccapo family: STDB counts, trajectories, return groups, step batches, actions."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

__all__ = [
    "ccapo_edge_counts", "ccapo_global_counts", "ccapo_trajectories", "ccapo_streams",
    "ccapo_return_groups", "ccapo_fingerprint_seqs", "ccapo_step_batches", "ccapo_alfworld_commands",
    "ccapo_gui_taps", "ccapo_logp_batches",
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


@st.composite
def ccapo_trajectories(draw, *, max_len: int = 8):
    """A finished trajectory over a tiny vocabulary (so edges repeat), anchors chained as in §5.2.1."""
    T = draw(st.integers(1, max_len))
    locs = draw(st.lists(st.sampled_from(_LOCS), min_size=T, max_size=T))
    fps = draw(st.lists(st.sampled_from(_FPS), min_size=T, max_size=T))
    anchors = [(loc, "<START>" if t == 0 else fps[t - 1]) for t, loc in enumerate(locs)]
    return {"anchors": anchors, "fingerprints": fps, "success": draw(st.booleans())}


def ccapo_streams(*, max_size: int = 12):
    """A list of trajectories fed to the STDB in order."""
    return st.lists(ccapo_trajectories(), min_size=1, max_size=max_size)


def ccapo_return_groups(*, max_groups: int = 4, max_n: int = 8):
    """[G, N] float64 returns on the R_tau grid (success or not, 1..50 steps), so ties are common."""
    @st.composite
    def build(draw):
        G, N = draw(st.integers(1, max_groups)), draw(st.integers(1, max_n))
        succ = draw(st.lists(st.booleans(), min_size=G * N, max_size=G * N))
        steps = draw(st.lists(st.integers(1, 50), min_size=G * N, max_size=G * N))
        r = [10.0 * s - 0.1 * k for s, k in zip(succ, steps)]
        return torch.tensor(r, dtype=torch.float64).reshape(G, N)
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
    return torch.tensor(vals, dtype=torch.float64).reshape(B, T), torch.tensor(valid).reshape(B, T)


_ALF = st.sampled_from([
    ("put {o} {i} in {r} {j}", "PUT({o}, {r})"), ("take {o} {i} from {r} {j}", "TAKE({o}, {r})"),
    ("go to {r} {j}", "GOTO({r})"), ("open {r} {j}", "OPEN({r})"),
    ("heat {o} {i} with {r} {j}", "HEAT({o}, {r})"), ("examine {o} {i}", "EXAMINE({o})"),
])


@st.composite
def ccapo_alfworld_commands(draw):
    """(command, expected fingerprint) with random object types and instance numbers."""
    tpl, fp = draw(_ALF)
    o = draw(st.sampled_from(["apple", "mug", "knife", "egg"]))
    r = draw(st.sampled_from(["fridge", "countertop", "microwave", "cabinet"]))
    i, j = draw(st.integers(1, 99)), draw(st.integers(1, 99))
    return tpl.format(o=o, r=r, i=i, j=j), fp.format(o=o, r=r)


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
    t = lambda a: torch.tensor(a.reshape(B, T), dtype=torch.float64)  # noqa: E731
    return t(new), t(old), t(ref), t(adv), torch.tensor(mask)
