"""GAE(λ) over the time axis (PPO-GAE-1) and terminated vs truncated steps (PPO-GAE-2).

The oracle is a brute-force forward sum per step (numpy loops): A_t = Σ_k (γλ)^(k−t) δ_k from t to
the first episode end, which shares nothing with the backward recursion an implementation uses.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_dtype,
    not_applicable,
    terminated_truncated,
    working_dtype,
)
from conformance_tests.oracles import np_


def _np_gae_row(r, v, v_next, done, trunc, gamma, lam):
    """One trajectory [T]: (advantage, returns) by explicit forward sums."""
    T = len(r)
    delta = [r[k] + gamma * (0.0 if done[k] else v_next[k]) - v[k] for k in range(T)]
    adv = np.zeros(T)
    for t in range(T):
        total, weight = 0.0, 1.0
        for k in range(t, T):
            total += weight * delta[k]
            if done[k] or trunc[k]:  # the episode ends at k: nothing after it belongs to A_t
                break
            weight *= gamma * lam
        adv[t] = total
    return adv, adv + np.asarray(v)


def np_gae(reward, value, next_value, done, truncated, gamma, lam):
    """[T] or [B,T] numpy oracle (rows independent)."""
    arrs = [np_(x) for x in (reward, value, next_value, done)]
    trunc = np.zeros(arrs[0].shape, dtype=bool) if truncated is None else np_(truncated).astype(bool)
    if arrs[0].ndim == 1:
        return _np_gae_row(*arrs[:3], arrs[3].astype(bool), trunc, gamma, lam)
    rows = [_np_gae_row(*(a[b] for a in arrs[:3]), arrs[3][b].astype(bool), trunc[b], gamma, lam)
            for b in range(arrs[0].shape[0])]
    return np.stack([a for a, _ in rows]), np.stack([ret for _, ret in rows])


_GAMMAS = st.one_of(st.sampled_from([0.0, 1.0, 0.99]), st.floats(0.0, 1.0))
_LAMS = st.one_of(st.sampled_from([0.0, 1.0, 0.95]), st.floats(0.0, 1.0))


@st.composite
def rollouts(draw, dtype, *, truncation: bool):
    """reward, value, next_value, done (and truncated) of shape [T] or [B,T], T in 1..8."""
    t = draw(st.integers(1, 8))
    shape = (t,) if draw(st.booleans()) else (draw(st.integers(1, 4)), t)
    floats = lambda lo, hi: draw(st_.tensors(shape, lo=lo, hi=hi, dtype=dtype))  # noqa: E731
    flags = lambda: torch.tensor(draw(st.lists(st.booleans(), min_size=int(np.prod(shape)),  # noqa: E731
                                               max_size=int(np.prod(shape))))).reshape(shape)
    case = {"reward": floats(-2.0, 2.0), "value": floats(-3.0, 3.0), "next_value": floats(-3.0, 3.0), "done": flags()}
    case["truncated"] = flags() if truncation else None
    if draw(st.booleans(), label="consistent rollout"):
        case["next_value"] = consistent_next_value(case)
    case["float_flags"] = draw(st.booleans(), label="done/truncated as 0/1 floats")  # the contract allows both
    return case, draw(_GAMMAS), draw(_LAMS)


def consistent_next_value(case: dict) -> torch.Tensor:
    """next_value with next_value[t] = value[t + 1] wherever step t neither ends (done) nor is truncated: what a
    collector storing one value per step produces, so a library that reads V(s_{t+1}) from the next step (and
    declares those rows only) still gets many examples. Ends and the last step keep their drawn bootstrap."""
    nv, v = case["next_value"].clone(), case["value"]
    ends = case["done"] | (case["truncated"] if case["truncated"] is not None else torch.zeros_like(case["done"]))
    inside = ~ends[..., :-1]
    nv[..., :-1] = torch.where(inside, v[..., 1:], nv[..., :-1])
    return nv


def _call(ppo, case, gamma, lam):
    """ppo.gae on the case; its flags as bool, or as 0/1 floats of the values' dtype where the case says so."""
    flag = (lambda f: f.to(case["value"].dtype)) if case.get("float_flags") else (lambda f: f)  # noqa: E731
    kw = {"truncated": flag(case["truncated"])} if case["truncated"] is not None else {}
    return ppo.gae(case["reward"], case["value"], case["next_value"], flag(case["done"]), gamma=gamma, lam=lam, **kw)


def _check(got, case, gamma, lam, clause):
    adv, ret = got
    want_adv, want_ret = np_gae(case["reward"], case["value"], case["next_value"], case["done"], case["truncated"],
                                gamma, lam)
    assert_close(adv, want_adv, clause, what="advantage")
    assert_close(ret, want_ret, clause, what="returns = advantage + value")


# ----------------------------------------------------------------------------- PPO-GAE-1
@pytest.mark.clause("PPO-GAE-1")
@given(st.data())
def test_gae_matches_the_forward_sum(ppo, data):
    dt = working_dtype()
    case, gamma, lam = data.draw(rollouts(dt, truncation=False))
    got = _call(ppo, case, gamma, lam)
    _check(got, case, gamma, lam, "PPO-GAE-1")
    assert_dtype(got, dt, "PPO-GAE-1")


@pytest.mark.clause("PPO-GAE-1")
def test_gae_golden(ppo):
    dt = working_dtype()
    r = torch.tensor([1.0, 1.0, 1.0], dtype=dt)
    zero = torch.zeros(3, dtype=dt)
    # δ = 1 everywhere; γλ = 0.25: A_2 = 1, A_1 = 1.25, A_0 = 1.3125
    adv, ret = ppo.gae(r, zero, zero, torch.zeros(3, dtype=torch.bool), gamma=0.5, lam=0.5)
    assert_close(adv, [1.3125, 1.25, 1.0], "PPO-GAE-1", what="advantage")
    assert_close(ret, [1.3125, 1.25, 1.0], "PPO-GAE-1", what="returns")


@pytest.mark.clause("PPO-GAE-1")
@given(st.data())
def test_gae_lambda_one_gamma_one_is_the_return_to_go(ppo, data):
    # consistent values (V'_t = V_{t+1}), no episode end: A_t telescopes to Σ_{k≥t} r_k + V'_{T−1} − V_t
    dt = working_dtype()
    t = data.draw(st.integers(1, 8))
    r, v = (data.draw(st_.tensors((t,), lo=-2.0, hi=2.0, dtype=dt)) for _ in range(2))
    boot = data.draw(st_.tensors((1,), lo=-2.0, hi=2.0, dtype=dt))
    v_next = torch.cat([v[1:], boot])
    adv, ret = ppo.gae(r, v, v_next, torch.zeros(t, dtype=torch.bool), gamma=1.0, lam=1.0)
    to_go = np.cumsum(np_(r)[::-1])[::-1] + float(boot)
    assert_close(ret, to_go, "PPO-GAE-1", what="λ = γ = 1 returns = rewards to go + bootstrap")


@pytest.mark.clause("PPO-GAE-1")
def test_gae_lambda_zero_is_the_one_step_residual(ppo):
    dt = working_dtype()
    r = torch.tensor([0.5, -1.0, 2.0], dtype=dt)
    v = torch.tensor([1.0, 0.0, -1.0], dtype=dt)
    v_next = torch.tensor([2.0, 4.0, 3.0], dtype=dt)
    done = torch.tensor([False, True, False])
    adv, _ = ppo.gae(r, v, v_next, done, gamma=0.5, lam=0.0)
    assert_close(adv, [0.5 + 1.0 - 1.0, -1.0 - 0.0, 2.0 + 1.5 + 1.0], "PPO-GAE-1", what="λ = 0 advantage = δ")


@pytest.mark.clause("PPO-GAE-1")
@pytest.mark.parametrize("where", [0, 3])
def test_gae_done_at_the_first_and_last_step(ppo, where):
    dt = working_dtype()
    r = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=dt)
    v = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=dt)
    v_next = torch.tensor([10.0, 20.0, 30.0, 40.0], dtype=dt)
    done = torch.zeros(4, dtype=torch.bool)
    done[where] = True
    case = {"reward": r, "value": v, "next_value": v_next, "done": done, "truncated": None}
    _check(ppo.gae(r, v, v_next, done, gamma=0.9, lam=0.8), case, 0.9, 0.8, "PPO-GAE-1")


@pytest.mark.clause("PPO-GAE-1")
def test_gae_rows_are_independent(ppo):
    # [B,T]: the second row's episode end must not leak into the first; time is the last axis
    dt = working_dtype()
    r = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=dt)
    zero = torch.zeros(2, 2, dtype=dt)
    done = torch.tensor([[False, False], [True, False]])
    adv, _ = ppo.gae(r, zero, zero, done, gamma=1.0, lam=1.0)
    assert_close(adv, [[2.0, 1.0], [1.0, 1.0]], "PPO-GAE-1", what="advantage per row")


# ----------------------------------------------------------------------------- PPO-GAE-2
@pytest.mark.clause("PPO-GAE-2")
@given(st.data())
def test_gae_with_truncation_matches_the_forward_sum(ppo, data):
    if not terminated_truncated():
        not_applicable("truncation needs the terminated_truncated capability")
    case, gamma, lam = data.draw(rollouts(working_dtype(), truncation=True))
    _check(_call(ppo, case, gamma, lam), case, gamma, lam, "PPO-GAE-2")


@pytest.mark.clause("PPO-GAE-2")
def test_gae_truncation_bootstraps_termination_does_not(ppo):
    if not terminated_truncated():
        not_applicable("truncation needs the terminated_truncated capability")
    dt = working_dtype()
    r = torch.tensor([1.0, 1.0, 1.0], dtype=dt)
    v = torch.zeros(3, dtype=dt)
    v_next = torch.tensor([0.0, 8.0, 8.0], dtype=dt)
    no = torch.zeros(3, dtype=torch.bool)
    cut = torch.tensor([False, True, False])
    # truncated at t=1: δ_1 = 1 + γ·8 = 5 (bootstrap kept), the trace stops there: A_0 = 1 + γλ·5
    adv, _ = ppo.gae(r, v, v_next, no, gamma=0.5, lam=0.5, truncated=cut)
    assert_close(adv, [1.0 + 0.25 * 5.0, 5.0, 5.0], "PPO-GAE-2", what="advantage with a truncation at t=1")
    # terminated at t=1: δ_1 = 1 (no bootstrap): A_0 = 1 + 0.25·1
    adv, _ = ppo.gae(r, v, v_next, cut, gamma=0.5, lam=0.5, truncated=no)
    assert_close(adv, [1.25, 1.0, 5.0], "PPO-GAE-2", what="advantage with a termination at t=1")
