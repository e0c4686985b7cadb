"""PPO §6: MAPPO replay rows keyed and sorted by (episode_id, timestep, agent_id), every field aligned
to its key, per-agent masks never broadcast, and the check that rejects misordered batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

from conformance_tests import strategies as st_
from conformance_tests.harness import assert_equal, assert_rejects, assert_that, host

KEY = ("episode_id", "timestep", "agent_id")
FIELDS = ("obs", "critic_obs", "action", "old_log_prob", "mask", "advantage", "return")


def keys_of(batch):
    return list(zip(*(host(batch[k]).tolist() for k in KEY)))


@pytest.mark.clause("PPO-MAPPO-1")
@given(st_.mappo_batches())
def test_align_sorts_rows_by_the_key_triple(ppo, case):
    batch, _ = case
    got = ppo.align_batch(batch)
    assert_equal(np.array(keys_of(got)), np.array(sorted(keys_of(batch))), "PPO-MAPPO-1",
                 "rows in lexicographic (episode_id, timestep, agent_id) order")
    ppo.check_alignment(got)  # an aligned batch passes the check


@pytest.mark.clause("PPO-MAPPO-1")
def test_check_alignment_golden_accepts_lexicographic_order(ppo):
    # sorted by (episode, timestep, agent): agent_id restarts at each timestep and timestep at each
    # episode, which the document's per-column assertions would wrongly reject
    batch = {"episode_id": torch.tensor([0, 0, 0, 0, 1]), "timestep": torch.tensor([0, 0, 1, 1, 0]),
             "agent_id": torch.tensor([0, 1, 0, 1, 0]), "action": torch.zeros(5, dtype=torch.int64)}
    assert_that(ppo.check_alignment(batch) is None, "PPO-MAPPO-1", "raised", "accepted")


@pytest.mark.clause("PPO-MAPPO-1")
def test_check_alignment_rejects_misordered_rows(ppo):
    batch = {"episode_id": torch.tensor([0, 0, 0]), "timestep": torch.tensor([0, 1, 0]),
             "agent_id": torch.tensor([0, 0, 1]), "action": torch.zeros(3, dtype=torch.int64)}
    assert_rejects("PPO-MAPPO-1", ppo.raw("check_alignment"), batch)


@pytest.mark.clause("PPO-MAPPO-1")
def test_duplicate_keys_are_rejected(ppo):
    batch = {"episode_id": torch.tensor([0, 0, 0]), "timestep": torch.tensor([1, 0, 1]),
             "agent_id": torch.tensor([1, 0, 1]), "action": torch.tensor([0, 1, 2])}
    assert_rejects("PPO-MAPPO-1", ppo.raw("align_batch"), batch)
    sorted_dup = {k: v[[1, 0, 2]] for k, v in batch.items()}
    assert_rejects("PPO-MAPPO-1", ppo.raw("check_alignment"), sorted_dup)


def _keyed(e, t, a):
    return {"episode_id": torch.tensor(e), "timestep": torch.tensor(t), "agent_id": torch.tensor(a),
            "action": torch.zeros(len(e), dtype=torch.int64)}


# Every pair of neighbouring rows is compared, not only the first: the order is checked with three or more
# rows and differing episode ids after the first pair, and the error locates the first bad pair.
@pytest.mark.clause("PPO-MAPPO-1")
def test_mappo_order_checked_on_every_pair_of_episodes(ppo):

    # episode 2 before episode 1 at rows 1-2 (row 0's episode 0 is below both)
    assert_rejects("PPO-MAPPO-1", ppo.raw("check_alignment"), _keyed([0, 2, 1], [0, 0, 0], [0, 0, 0]))
    # after sorting, the repeated key (1, 0, 0) sits at rows 1-2
    assert_rejects("PPO-MAPPO-1", ppo.raw("align_batch"), _keyed([1, 0, 1], [0, 0, 0], [0, 0, 0]))
    # every pair out of order (the mutant that reports the first GOOD pair finds none and fails on indexing)
    assert_rejects("PPO-MAPPO-1", ppo.raw("check_alignment"), _keyed([1, 0], [0, 0], [0, 0]))


@pytest.mark.clause("PPO-MAPPO-2")
@given(st_.mappo_batches())
def test_every_field_stays_with_its_key(ppo, case):
    batch, oracle = case
    got = host(ppo.align_batch(batch))
    wants = [oracle(*key) for key in keys_of(got)]
    for f in FIELDS:  # whole fields at once (rollouts reach 16 agents x 160 steps); the message names the row
        want = torch.as_tensor(np.array([w[f] for w in wants])).to(got[f].dtype)
        bad = (got[f] != want).reshape(len(wants), -1).any(-1).nonzero().flatten()
        i = int(bad[0]) if len(bad) else None
        assert_that(i is None, "PPO-MAPPO-2", None if i is None else got[f][i],
                    "" if i is None else f"field {f!r} of row {i} (key {keys_of(got)[i]}) = {want[i].tolist()}")


@pytest.mark.clause("PPO-MAPPO-2")
def test_alignment_golden(ppo):
    # storage order agent-major; actor obs, critic obs and advantage all carry the row's key
    e = torch.tensor([7, 7, 7, 7])
    t = torch.tensor([0, 1, 0, 1])
    g = torch.tensor([0, 0, 1, 1])
    batch = {"episode_id": e, "timestep": t, "agent_id": g, "obs": (10 * t + g).double().view(-1, 1),
             "critic_obs": (100 * t + g).double().view(-1, 1), "advantage": (t - g).double()}
    got = ppo.align_batch(batch)
    assert_equal(got["obs"].flatten(), torch.tensor([0.0, 1.0, 10.0, 11.0], dtype=torch.float64), "PPO-MAPPO-2")
    assert_equal(got["critic_obs"].flatten(), torch.tensor([0.0, 1.0, 100.0, 101.0], dtype=torch.float64), "PPO-MAPPO-2")
    assert_equal(got["advantage"], torch.tensor([0.0, -1.0, 1.0, 0.0], dtype=torch.float64), "PPO-MAPPO-2")


@pytest.mark.clause("PPO-MAPPO-4")
@given(st_.mappo_batches())
def test_each_row_keeps_its_own_agents_mask(ppo, case):
    batch, oracle = case
    got = ppo.align_batch(batch)
    want = torch.as_tensor(np.array([oracle(*key)["mask"] for key in keys_of(got)]))
    assert_equal(got["mask"], want, "PPO-MAPPO-4", "each row's own agent mask, in key order")


@pytest.mark.clause("PPO-MAPPO-4")
def test_per_agent_masks_golden(ppo):
    # two agents at the same step with disjoint legal sets: broadcasting agent 0's mask to agent 1
    # would make agent 1's stored action illegal
    batch = {"episode_id": torch.tensor([0, 0]), "timestep": torch.tensor([0, 0]), "agent_id": torch.tensor([1, 0]),
             "mask": torch.tensor([[False, False, True], [True, True, False]]), "action": torch.tensor([2, 0])}
    got = ppo.align_batch(batch)
    assert_equal(got["mask"], torch.tensor([[True, True, False], [False, False, True]]), "PPO-MAPPO-4")
    assert_equal(got["action"], torch.tensor([0, 2]), "PPO-MAPPO-4")


@pytest.mark.clause("PPO-INPUT-5")
def test_ragged_or_keyless_mappo_batches_are_rejected(ppo):
    ok = {"episode_id": torch.tensor([0, 0]), "timestep": torch.tensor([0, 1]), "agent_id": torch.tensor([0, 0])}
    assert_rejects("PPO-INPUT-5", ppo.raw("align_batch"), {**ok, "action": torch.tensor([0, 1, 2])})
    assert_rejects("PPO-INPUT-5", ppo.raw("align_batch"), {k: v for k, v in ok.items() if k != "agent_id"})


# A key field without a row axis makes a ragged batch, rejected as such (naming PPO-INPUT-5), not left to fail
# on indexing its missing row axis.
@pytest.mark.clause("PPO-INPUT-5")
@pytest.mark.parametrize("field", ["timestep", "agent_id"])
def test_mappo_key_field_without_rows_rejected(ppo, field):

    batch = {**_keyed([0, 0], [0, 1], [0, 0]), field: torch.tensor(0)}
    assert_rejects("PPO-INPUT-5", ppo.raw("align_batch"), batch)
