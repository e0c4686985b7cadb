"""The GiGPO comparison arm's pieces (reference_impl.ccapo.textworld.gigpo) against values worked by hand.

GiGPO is the TextWorld trainer's third arm, not a CCAPO clause: its step rewards spread CCAPO-R-1's R_τ over
the steps, its step value is the discounted return, and its step advantage z-scores that return inside each
anchor-state group (population std, ε = 1e-6, 0 off the valid steps). The trainer's wiring test checks the
arm end to end; these check each function alone, fast and without TextWorld.
"""
from __future__ import annotations

import pytest
import torch

from conformance_tests.harness import assert_that
from reference_impl.ccapo.textworld.gigpo import anchor_group_advantage, discounted_returns, step_rewards

pytestmark = pytest.mark.meta


def _close(got: torch.Tensor, want, what: str, atol: float = 1e-6) -> None:
    want = torch.as_tensor(want, dtype=got.dtype)
    assert_that(got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=atol), "GiGPO", got,
                f"{what}: {want.tolist()}")


# ----------------------------------------------------------------------------- step rewards
def test_step_rewards_penalise_every_played_step_and_pay_the_winning_one():

    success, steps = torch.tensor([True, False, True, False]), torch.tensor([3, 4, 1, 0])
    r = step_rewards(success, steps, 4, r_terminal=10.0, r_penalty=-0.5)
    _close(r, [[-0.5, -0.5, 9.5, 0.0],     # won at step 3: R_terminal on its last step
               [-0.5, -0.5, -0.5, -0.5],   # lost after the whole horizon: penalties only
               [9.5, 0.0, 0.0, 0.0],       # won at once
               [0.0, 0.0, 0.0, 0.0]],      # no step played: nothing
           "per-step rewards by hand")
    _close(r.sum(1), [10 - 1.5, -2.0, 9.5, 0.0], "each row sums to CCAPO-R-1's R_tau")


def test_step_rewards_read_a_0_1_success_flag():

    r = step_rewards(torch.tensor([1.0, 0.0]), torch.tensor([2, 2]), 3, r_terminal=1.0, r_penalty=0.0)
    _close(r, [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], "a 0/1 float success flag reads as a bool")


# ----------------------------------------------------------------------------- discounted returns
def test_discounted_returns_by_hand():

    rewards = torch.tensor([[1.0, 0.0, 2.0, 4.0], [0.0, -1.0, 0.0, 0.0]])
    want = [[1 + 0.25 * 2 + 0.125 * 4, 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0], [-0.5, -1.0, 0.0, 0.0]]
    _close(discounted_returns(rewards, gamma=0.5), want, "G_t = sum_k gamma^k r_(t+k)")
    _close(discounted_returns(rewards, gamma=1.0), [[7.0, 6.0, 6.0, 4.0], [-1.0, -1.0, 0.0, 0.0]], "gamma 1: tail sums")
    _close(discounted_returns(rewards, gamma=0.0), rewards, "gamma 0: the rewards themselves")


def test_discounted_returns_of_a_one_step_horizon_are_the_rewards():

    rewards = torch.tensor([[2.0], [-0.5]])
    _close(discounted_returns(rewards, gamma=0.9), rewards, "H = 1: nothing follows the only step")


def test_discounted_returns_run_along_the_last_dim_and_leave_the_input_alone():

    rewards = torch.arange(12, dtype=torch.float64).view(2, 2, 3)
    before = rewards.clone()
    got = discounted_returns(rewards, gamma=0.5)
    want = torch.stack([rewards[..., 0] + 0.5 * rewards[..., 1] + 0.25 * rewards[..., 2],
                        rewards[..., 1] + 0.5 * rewards[..., 2], rewards[..., 2]], dim=-1)
    _close(got, want, "each [.., H] row by its own recursion", atol=1e-12)
    assert_that(got.dtype == torch.float64 and torch.equal(rewards, before), "GiGPO", got.dtype,
                "the rewards' dtype, and the rewards untouched")


# ----------------------------------------------------------------------------- anchor-group advantage
def test_anchor_groups_z_score_by_hand():

    vals = torch.tensor([[1.0, 2.0, 3.0, 9.0], [5.0, 2.0, 0.0, 7.0], [3.0, 4.0, 6.0, -2.0]])
    ids = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 3], [0, 3, 4, 4]])
    valid = torch.tensor([[True, True, True, True], [True, True, False, True], [True, True, False, False]])
    got = anchor_group_advantage(vals, ids, valid, n_groups=5)
    # group 0 = {1, 5, 3} (rows 0..2): mean 3, population std sqrt(8/3) -> -2/s, +2/s, 0
    # group 1 = {2, 2}: std 0 -> 0;  group 2 = {3}: a singleton -> 0;  group 3 = {9, 7, 4}: mean 20/3,
    # population std sqrt(((7/3)^2 + (1/3)^2 + (8/3)^2) / 3) = sqrt(114/27);  group 4: only invalid steps
    s0, s3 = (8 / 3) ** 0.5, (114 / 27) ** 0.5
    want = [[-2 / s0, 0.0, 0.0, (9 - 20 / 3) / s3],
            [2 / s0, 0.0, 0.0, (7 - 20 / 3) / s3],
            [0.0, (4 - 20 / 3) / s3, 0.0, 0.0]]
    _close(got, want, "population z-scores within each anchor group, 0 off the valid steps", atol=1e-5)


def test_anchor_groups_ignore_what_the_invalid_steps_hold():

    vals = torch.tensor([[1.0, 3.0, 1e6]])
    valid = torch.tensor([[True, True, False]])
    # the padding step claims group 0 and holds a huge value: neither may move the group's statistics
    got = anchor_group_advantage(vals, torch.tensor([[0, 0, 0]]), valid, n_groups=1)
    _close(got, [[-1.0, 1.0, 0.0]], "{1, 3}: mean 2, std 1", atol=1e-5)


def test_anchor_group_epsilon_sits_on_the_std():

    vals = torch.tensor([[0.0, 2e-6]], dtype=torch.float64)
    got = anchor_group_advantage(vals, torch.tensor([[0, 0]]), torch.tensor([[True, True]]), n_groups=1)
    # population std 1e-6, + eps 1e-6 -> (±1e-6) / 2e-6
    _close(got, [[-0.5, 0.5]], "(G - mean) / (std + 1e-6)", atol=1e-9)
    custom = anchor_group_advantage(vals, torch.tensor([[0, 0]]), torch.tensor([[True, True]]), n_groups=1, eps=0.0)
    _close(custom, [[-1.0, 1.0]], "eps 0: the plain z-score", atol=1e-9)
    assert_that(got.dtype == torch.float64, "GiGPO", got.dtype, "the values' dtype")
