"""The CCAPO trainer's toy task (reference_impl.ccapo.env: fetch the key, open the chest) against hand-worked
layouts: what an agent sees, what it may do, what each command does, when an episode ends, and how layouts
are drawn. A wrong observation, mask or end trains the CCAPO arms badly without an error; these are our own
fixtures, not clause tests.
"""
from __future__ import annotations

import numpy as np
import pytest

from reference_impl.ccapo.env import (
    ACTIONS,
    CHEST_HOME,
    KEY_HOME,
    OBS_DIM,
    OPEN,
    ROOMS,
    TAKE,
    KeyChestEnv,
    Layout,
    _dist,
    make_layout,
)

pytestmark = pytest.mark.meta
R = len(ROOMS)


def _line(start: int = 0, key: int = 2, chest: int = 4) -> Layout:
    """Rooms 0-1-2-3-4-5 in a corridor."""
    adj = np.zeros((R, R), dtype=bool)
    for i in range(R - 1):
        adj[i, i + 1] = adj[i + 1, i] = True
    return Layout(adj, start, key, chest)


def test_commands_and_indices():
    assert len(ACTIONS) == R + 2 and OBS_DIM == 4 * R + 1
    assert ACTIONS[TAKE] == "take key 1" and ACTIONS[OPEN] == "open chest 1" and ACTIONS[1] == "go to hall 1"


def test_observation_by_hand():
    env = KeyChestEnv(_line(start=1, key=2, chest=4), max_steps=10)
    o = env.obs()
    want = np.zeros(OBS_DIM, dtype=np.float32)
    want[1] = 1  # here: the hall
    want[R + 1 + 2] = 1  # where the key lies (no key held yet)
    want[2 * R + 1 + 4] = 1  # where the chest is
    want[3 * R + 1 + 0] = want[3 * R + 1 + 2] = 1  # corridors from the hall
    np.testing.assert_array_equal(o, want)
    assert o.dtype == np.float32
    env.step(2)
    env.step(TAKE)
    o = env.obs()
    assert o[R] == 1 and not o[R + 1:2 * R + 1].any(), "holding the key: flag set, the key's room no longer shown"
    assert o[2] == 1 and o[2 * R + 1 + 4] == 1


def test_legal_commands_are_the_corridors_take_and_open():
    env = KeyChestEnv(_line(start=0), max_steps=10)
    np.testing.assert_array_equal(env.legal(), [False, True, False, False, False, False, True, True])
    env.step(1)
    np.testing.assert_array_equal(env.legal(), [True, False, True, False, False, False, True, True])
    assert env.location() == "hall"


def test_an_episode_by_hand():
    env = KeyChestEnv(_line(start=1, key=2, chest=4), max_steps=20)
    env.step(4)  # no corridor from the hall to the garage: a step spent, nothing moves
    assert (env.room, env.t, env.done) == (1, 1, False)
    env.step(TAKE)  # no key here
    env.step(OPEN)  # no key held
    assert not env.has_key and not env.success and env.t == 3
    for a in (2, TAKE, 3, OPEN):  # open before reaching the chest: still shut
        env.step(a)
    assert env.has_key and env.room == 3 and not env.success and not env.done
    env.step(TAKE)  # taking twice changes nothing
    env.step(4)
    env.step(OPEN)
    assert env.success and env.done and env.t == 10


def test_the_step_limit_ends_an_episode_that_failed():
    env = KeyChestEnv(_line(), max_steps=3)
    for t in range(1, 4):
        env.step(TAKE)
        assert env.done == (t == 3) and not env.success


def test_a_layout_cannot_change_under_the_episodes_that_share_it():
    import dataclasses

    layout = _line()
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.key = 3


def test_shortest_and_distance_by_hand():
    layout = _line(start=1, key=3, chest=0)
    adj = layout.adjacency
    assert _dist(adj, 1, 3) == 2 and _dist(adj, 3, 0) == 3 and _dist(adj, 2, 2) == 0
    assert layout.shortest == 2 + 3 + 2  # walk, take, walk, open
    ring = adj.copy()
    ring[0, 5] = ring[5, 0] = True
    assert _dist(ring, 0, 5) == 1 and _dist(ring, 1, 5) == 2


@pytest.mark.parametrize("prior", [0.0, 1.0])
def test_layouts_are_connected_trees_plus_one_corridor(prior):
    rng = np.random.default_rng(0)
    for _ in range(50):
        L = make_layout(rng, prior=prior)
        adj = L.adjacency
        assert adj.dtype == bool and (adj == adj.T).all() and not adj.diagonal().any()
        assert R - 1 <= adj.sum() // 2 <= R  # a spanning tree, plus a corridor that may repeat one of it
        assert all(_dist(adj, 0, r) < R for r in range(R))  # connected
        assert len({L.start, L.key, L.chest}) == 3
        if prior == 1.0:
            assert L.key in KEY_HOME and L.chest in CHEST_HOME


def test_layouts_follow_their_seed_and_uniform_ones_take_no_prior_draw():
    a, b = make_layout(np.random.default_rng(3)), make_layout(np.random.default_rng(3), prior=0.0)
    assert (a.adjacency == b.adjacency).all() and (a.start, a.key, a.chest) == (b.start, b.key, b.chest)
    rng = np.random.default_rng(4)
    make_layout(rng)
    after = rng.random()
    rng = np.random.default_rng(4)
    make_layout(rng, prior=0.0)
    assert rng.random() == after
    keys = {make_layout(np.random.default_rng(s)).key for s in range(60)}
    assert keys == set(range(R)), "without the prior the key may lie in any room"
