"""Strategies of the ppo family: log-prob pairs, ratios, advantages, rollouts for the update loop,
MAPPO batches keyed by (episode_id, timestep, agent_id), single rows for local-index remapping."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance_tests.strategies.core import batch_shapes, legal_masks, tensors

__all__ = ["log_prob_pairs", "ratios_and_advantages", "advantages", "rollouts", "mappo_batches", "masked_rows"]

_FINITE = dict(allow_nan=False, allow_infinity=False)


@st.composite
def log_prob_pairs(draw, *, max_batch: int = 16, lo: float | None = None, spread: float | None = None):
    """(old_log_prob, new_log_prob), float64 [B] each: log-probs in [lo, 0] and new within ±spread of old.
    Without ``lo`` some draws reach -1e3 (a far-off-policy token: exp(old) underflows, the ratio must not);
    without ``spread`` most draws move by at most 1.5 and some by up to 30, past any log-ratio clamp (±20)."""
    b = draw(st.integers(1, max_batch))
    lo = draw(st.sampled_from([-8.0, -8.0, -1e3])) if lo is None else lo
    spread = draw(st.sampled_from([1.5, 1.5, 30.0])) if spread is None else spread
    old = draw(tensors((b,), lo=lo, hi=0.0))
    delta = draw(tensors((b,), lo=-spread, hi=spread))
    return old, (old + delta).clamp_max(0.0)


@st.composite
def ratios_and_advantages(draw, *, max_batch: int = 16):
    """(ratio, advantage), float64 [B] each: ratios in [0.2, 3] (many inside any clip range) or, in some draws,
    up to 12 (where a dual clip at 3 would bite), advantages in [-5, 5]."""
    b = draw(st.integers(1, max_batch))
    hi = draw(st.sampled_from([3.0, 3.0, 12.0]))
    return draw(tensors((b,), lo=0.2, hi=hi)), draw(tensors((b,), lo=-5.0, hi=5.0))


@st.composite
def advantages(draw, *, min_size: int = 2, max_size: int = 32, scale: float = 50.0):
    """float64 [N] with N >= 2 and not all equal."""
    n = draw(st.integers(min_size, max_size))
    a = draw(hnp.arrays(np.float64, (n,), elements=st.floats(-scale, scale, **_FINITE)))
    if np.ptp(a) < 1e-3:
        a[0] += 1.0
    return torch.tensor(a)


@st.composite
def rollouts(draw, *, max_rows: int = 12, max_actions: int = 6, dtype=torch.float64):
    """A small stored rollout for the update loop, one state per row (row i is state i).

    Keys: ``logits`` [N,A] (initial actor table), ``values`` [N] (initial critic table), ``mask``
    [N,A] bool (>= 1 legal per row), ``advantage`` [N], ``return`` [N], ``seed`` (for the sampler).
    Actions and old log-probs are drawn by the implementation's sampler in the test.
    """
    n, a = draw(batch_shapes(max_batch=max_rows, min_actions=2, max_actions=max_actions).filter(lambda s: s[0] >= 2))
    return {
        "logits": draw(tensors((n, a), lo=-3.0, hi=3.0, dtype=dtype)),
        "values": draw(tensors((n,), lo=-2.0, hi=2.0, dtype=dtype)),
        "mask": draw(legal_masks((n, a))),
        "advantage": draw(tensors((n,), lo=-2.0, hi=2.0, dtype=dtype)),
        "return": draw(tensors((n,), lo=-2.0, hi=2.0, dtype=dtype)),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@st.composite
def mappo_batches(draw, *, max_episodes: int = 3, max_steps: int = 4, max_agents: int = 3, n_actions: int = 5,
                  wide: bool = True):
    """A MAPPO rollout in storage (shuffled) order: every field of a row is a function of its key.

    Keys: episode_id, timestep, agent_id (int64 [N]), obs [N,3] = (e, t, g) as float, critic_obs
    [N,2], action [N], old_log_prob [N], mask [N,A] (distinct per agent), advantage [N], return [N].
    With ``wide`` some draws are full-size rollouts of 12..16 agents x 128..160 steps.
    Returns (batch, oracle) where ``oracle(e, t, g)`` gives the row's fields for checking alignment.
    """
    if wide and draw(st.integers(0, 3)) == 0:
        E, T, G = draw(st.integers(1, 2)), draw(st.integers(128, 160)), draw(st.integers(12, 16))
    else:
        E, T, G = draw(st.integers(1, max_episodes)), draw(st.integers(1, max_steps)), draw(st.integers(2, max_agents))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    keys = [(e, t, a) for e in range(E) for t in range(T) for a in range(G)]
    keep = g.random(len(keys)) < draw(st.sampled_from([1.0, 0.7]))  # agents that are done leave gaps
    keys = [k for k, kp in zip(keys, keep) if kp] or keys[:2]
    episode_ids = draw(st.lists(st.integers(0, 10**6), min_size=E, max_size=E, unique=True))
    masks = {}
    for k in keys:  # each (e, t, g) its own legal set; agent g's action g % A always legal
        m = g.random(n_actions) < 0.5
        m[k[2] % n_actions] = True
        masks[k] = m

    def oracle(e, t, g):
        return {
            "obs": [float(e), float(t), float(g)], "critic_obs": [float(e * 100 + t), float(g)],
            "action": g % n_actions, "old_log_prob": -0.1 * (1 + t + g), "mask": masks[(e, t, g)],
            "advantage": 0.5 * e - 0.25 * t + 0.125 * g, "return": 1.0 + 0.1 * t - 0.2 * g,
        }

    perm = g.permutation(len(keys))
    rows = [keys[i] for i in perm]
    fields = [oracle(*k) for k in rows]
    batch = {
        "episode_id": torch.tensor([episode_ids[k[0]] for k in rows], dtype=torch.int64),
        "timestep": torch.tensor([k[1] for k in rows], dtype=torch.int64),
        "agent_id": torch.tensor([k[2] for k in rows], dtype=torch.int64),
        **{f: torch.tensor(np.array([r[f] for r in fields])) for f in fields[0]},
    }
    batch["obs"] = batch["obs"].to(torch.float64)
    batch["action"] = batch["action"].to(torch.int64)
    inverse = {eid: e for e, eid in enumerate(episode_ids)}
    return batch, (lambda eid, t, g: oracle(inverse[eid], t, g))


@st.composite
def masked_rows(draw, *, max_actions: int = 10, scale: float = 10.0, min_legal: int = 1):
    """(logits_row [A] float64, mask_row [A] bool) for local-index remapping."""
    a = draw(st.integers(2, max_actions))
    z = draw(tensors((a,), lo=-scale, hi=scale))
    m = draw(legal_masks((1, a), min_legal=min_legal))[0]
    return z, m
