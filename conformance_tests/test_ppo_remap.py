"""PPO §5: sampling on the compacted legal set, rebuilding the same local distribution at update,
scoring local_idx (never the global id), and rejecting out-of-range local indices."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import logsumexp

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    assert_rejects,
    assert_that,
    generator,
    to_numpy,
)


def logit_scale(z) -> float:
    """A log-prob is a difference on the logits' scale: float32 rounds log-sum-exp(46, 32, 32) to 46 exactly,
    and bfloat16 log-sum-exp(0, 4) = 4.018 to 4."""
    return max(1.0, float(np.abs(to_numpy(z)).max()))


def np_global_masked_log_prob(z, mask) -> np.ndarray:
    z, mask = z.detach().double().numpy(), to_numpy(mask)
    zz = np.where(mask, z, -np.inf)
    return zz - logsumexp(zz)


@pytest.mark.clause("PPO-REMAP-1")
@given(st_.masked_rows(), st.integers(0, 2**31 - 1))
def test_local_sample_stores_valid_ids_local_idx_and_global_action(ppo, zm, seed):
    z, mask = zm
    z = z.clone().requires_grad_(True)
    valid_ids, local_idx, action_id, old = ppo.local_sample(z, mask, generator=generator(seed))
    assert_equal(valid_ids, torch.nonzero(mask).flatten(), "PPO-REMAP-1", "valid_ids = the legal ids, ascending")
    k = int(local_idx)
    assert_that(0 <= k < len(valid_ids), "PPO-REMAP-1", local_idx, f"a local index in [0, {len(valid_ids)})")
    assert_equal(action_id, valid_ids[k], "PPO-REMAP-1", "action_id = valid_ids[local_idx]")
    assert_that(not old.requires_grad, "PPO-REMAP-1", old, "a detached old log-prob")
    assert_close(old, np_global_masked_log_prob(z, mask)[int(action_id)], "PPO-REMAP-1", scale=logit_scale(z),
                 what="old log-prob = masked global log-prob of the action")


# The draw is the generator's: generators seeded alike give the same draws and another seed other draws (a
# sampler that ignores its generator draws from the global stream, and a seeded rollout cannot be replayed).
@pytest.mark.clause("PPO-REMAP-1")
def test_local_sample_draws_from_the_generator_it_is_given(ppo):
    z = torch.zeros(6, dtype=torch.float64)
    mask = torch.tensor([True, False, True, True, False, True])

    def draws(seed):
        g = generator(seed)
        return [int(ppo.local_sample(z, mask, generator=g)[1]) for _ in range(24)]

    first = draws(11)
    assert_equal(draws(11), first, "PPO-REMAP-1", "the same 24 draws from a generator seeded alike")
    assert_that(draws(12) != first, "PPO-REMAP-1", first, "other draws from a generator seeded otherwise")


@pytest.mark.clause("PPO-REMAP-1")
@given(st_.masked_rows(scale=50.0))
def test_local_log_prob_equals_masked_global_log_prob(ppo, zm):
    z, mask = zm
    valid_ids = torch.nonzero(mask).flatten()
    expected = np_global_masked_log_prob(z, mask)[to_numpy(valid_ids)]
    for k in range(len(valid_ids)):
        got = ppo.local_log_prob(z, valid_ids, torch.tensor(k))
        assert_close(got, expected[k], "PPO-REMAP-1", scale=logit_scale(z),
                     what=f"local_idx={k} (global id {int(valid_ids[k])})")


@pytest.mark.clause("PPO-REMAP-1")
def test_local_log_prob_golden(ppo):
    # legal ids {0, 2, 3}; local index 1 is global id 2. Scoring the global id 2 as a local index
    # would return the log-prob of global id 3 instead.
    z = torch.tensor([1.0, 9.0, 2.0, 0.0], dtype=torch.float64)
    valid_ids = torch.tensor([0, 2, 3])
    lse = math.log(math.exp(1.0) + math.exp(2.0) + math.exp(0.0))
    assert_close(ppo.local_log_prob(z, valid_ids, torch.tensor(1)), 2.0 - lse, "PPO-REMAP-1")
    assert_close(ppo.local_log_prob(z, valid_ids, torch.tensor([0, 2])), [1.0 - lse, 0.0 - lse], "PPO-REMAP-1")


@pytest.mark.clause("PPO-REMAP-1")
@given(st_.masked_rows(min_legal=2), st.integers(0, 2**31 - 1))
def test_sample_then_replay_round_trip(ppo, zm, seed):
    # differential: the update's rebuilt local distribution reproduces the sampler's log-prob exactly
    z, mask = zm
    valid_ids, local_idx, _, old = ppo.local_sample(z, mask, generator=generator(seed))
    assert_close(ppo.local_log_prob(z, valid_ids, local_idx), old, "PPO-REMAP-1")


@pytest.mark.clause("PPO-REMAP-2")
@given(st_.masked_rows(), st.data())
def test_out_of_range_local_index_is_an_error(ppo, zm, data):
    z, mask = zm
    valid_ids = torch.nonzero(mask).flatten()
    K = len(valid_ids)
    bad = data.draw(st.one_of(st.integers(K, K + 5), st.integers(-5, -1)))
    assert_rejects("PPO-REMAP-2", ppo.raw("local_log_prob"), z, valid_ids, torch.tensor(bad))


@pytest.mark.clause("PPO-REMAP-2")
def test_out_of_range_local_index_golden_never_maps_to_the_last_action(ppo):
    z = torch.tensor([0.0, 3.0, 1.0], dtype=torch.float64)
    valid_ids = torch.tensor([0, 2])
    # min(idx, len−1) would silently return log π(global id 2) for the out-of-range index 2
    assert_rejects("PPO-REMAP-2", ppo.raw("local_log_prob"), z, valid_ids, torch.tensor(2))
    assert_rejects("PPO-REMAP-2", ppo.raw("local_log_prob"), z, valid_ids, torch.tensor([0, 5]))


@pytest.mark.clause("PPO-INPUT-3")
def test_valid_ids_outside_the_action_space_are_rejected(ppo):
    z = torch.zeros(3, dtype=torch.float64)
    assert_rejects("PPO-INPUT-3", ppo.raw("local_log_prob"), z, torch.tensor([0, 3]), torch.tensor(0))


@pytest.mark.clause("PPO-INPUT-1", "PPO-INPUT-2")
def test_local_sample_rejects_bad_rows(ppo):
    assert_rejects("PPO-INPUT-1", ppo.raw("local_sample"), torch.tensor([0.0, float("nan")]), torch.tensor([True, True]))
    assert_rejects("PPO-INPUT-2", ppo.raw("local_sample"), torch.zeros(2), torch.tensor([False, False]))
