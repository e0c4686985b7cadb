"""PPO tests written to kill mutants that survived the mutation run (tools/mutation/, docs/mutation/).

Each test names the surviving mutant class it closes. Expected values are hand-computed thresholds or
numpy closed forms; the spec's defaults are read from spec/, never from the implementation.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_close, assert_equal, convention, declares, np_standardise, require_dtype
from rlconform.spec import default_spec

F64 = torch.float64


def spec_default(clause: str, key: str) -> float:
    return float(default_spec().clause(clause).value[key])


# Mutant class: a threshold's default or its strictness changed (`> f * target` -> `>=`, 2.0 -> 3.0).
@pytest.mark.clause("PPO-KLSTOP-1", "PPO-DEFAULT-2")
@pytest.mark.parametrize("scale, stop", [(0.5, False), (1.0, False), (1.0 + 1e-6, True), (1.2, True)])
def test_kl_early_stop_defaults_and_strict_threshold(ppo, scale, stop):
    """Stop exactly when approx_kl > kl_stop_factor * target_kl (0.03 with the seed's defaults), equality
    excluded; the factor follows the kl_stop_factor convention."""
    bound = convention("kl_stop_factor") * spec_default("PPO-DEFAULT-2", "target_kl")
    assert_equal(bool(ppo.kl_early_stop(bound * scale)), stop, "PPO-KLSTOP-1",
                 what=f"kl_early_stop({bound * scale}) with target_kl and factor at their defaults")


@pytest.mark.clause("PPO-SELFTEST-1")
def test_log_ratio_excess_default_threshold_is_two_and_strict(ppo):
    """Rows with new - old of 1.5, exactly 2, 2.5 and 3.5 over the default threshold 2: two of four exceed it."""
    old = torch.tensor([-4.0, -4.0, -4.0, -4.0], dtype=F64)
    new = old + torch.tensor([1.5, 2.0, 2.5, 3.5], dtype=F64)
    assert_close(ppo.log_ratio_excess(new, old), 0.5, "PPO-SELFTEST-1", what="share of rows with new - old > 2")


@pytest.mark.clause("PPO-ADV-1", "PPO-DEFAULT-3")
def test_normalize_advantages_default_eps(ppo):
    """(A - mean) / (std + eps) with the Bessel std and eps at its default, on a batch with a tiny spread,
    where eps is not negligible. A spread of 1e-8 around 1 exists only in float64 (float32's spacing at 1 is
    1.2e-7), so the check is not applicable to an implementation without float64."""
    require_dtype(F64)
    a = np.array([1.0, 1.0 + 2e-8, 1.0 - 1e-8, 1.0 + 4e-8])
    std = convention("advantage_std")  # the seed's Bessel std plus eps, or the declared ddof and eps form
    eps = spec_default("PPO-DEFAULT-3", "adv_eps") if not declares("advantage_std") else std["eps"]
    want = np_standardise(a, std, eps)
    assert_close(ppo.normalize_advantages(torch.tensor(a, dtype=F64)), want, "PPO-ADV-1", approx="reduction",
                 what="normalize_advantages without eps (the default must be 1e-8)")


# Mutant class: the clip range check admits clip_eps = 1 (the range is the open interval (0, 1)).
@pytest.mark.clause("PPO-INPUT-4")
@pytest.mark.parametrize("op", ["clip_fraction", "clipped_policy_loss"])
def test_clip_eps_of_one_rejected(ppo, op):
    from conformance_tests.harness import assert_rejects

    r = torch.tensor([0.9, 1.1, 1.3], dtype=F64)
    args = (r,) if op == "clip_fraction" else (r, torch.tensor([1.0, -1.0, 0.5], dtype=F64))
    assert_rejects("PPO-INPUT-4", ppo.raw(op), *args, clip_eps=1.0)


# Mutant class: `|r - 1| > eps` -> `>=`. A ratio exactly on the edge of [1 - eps, 1 + eps] is not clipped.
@pytest.mark.clause("PPO-CLIPFRAC-1")
def test_clip_fraction_excludes_ratios_exactly_on_the_edge(ppo):
    # r - 1 is exact in float64 for r in [0.5, 2]: 1.25 and 0.75 sit exactly on the edges of eps = 0.25
    r = torch.tensor([1.25, 0.75, 1.2500001, 0.7499999, 1.0], dtype=F64)
    assert_close(ppo.clip_fraction(r, clip_eps=0.25), 2 / 5, "PPO-CLIPFRAC-1", what="share of |r - 1| > 0.25")


# Mutant class: the "no row has a choice" case (sum log|A| = 0) falls through to H / tiny. The contract
# gives 0 there whatever the per-row entropies (a one-action row's entropy is 0 up to rounding).
@pytest.mark.clause("PPO-SLO-4")
@pytest.mark.parametrize("noise", [0.0, 1e-12, 3e-9])
def test_entropy_ratio_is_zero_when_no_row_has_a_choice(ppo, noise):
    mask = torch.tensor([[True, False, False], [False, False, True]])
    got = ppo.entropy_ratio(torch.full((2,), noise, dtype=F64), mask)
    assert_close(got, 0.0, "PPO-SLO-4", dtype=F64, what="entropy_ratio with one legal action in every row")



# Mutant class: the "fewer than two rows" special case widened (`< 2` -> `<= 2`): two rows have a
# Bessel-corrected std; only a single row gives 0.
@pytest.mark.clause("PPO-RATIO-2")
@pytest.mark.parametrize("rows", [[1.1], [0.9, 1.3], [0.8, 1.0, 1.5]])
def test_ratio_std_is_bessel_std_from_two_rows(ppo, rows):
    a = np.array(rows)
    want = a.std(ddof=1) if len(a) > 1 else 0.0
    assert_close(ppo.ratio_std(torch.tensor(a, dtype=F64)), want, "PPO-RATIO-2", what=f"ratio_std of {len(a)} row(s)")


# The trainers' time-major GAE (reference_impl/ppo/gae.py) is a helper of our own trainers, not the contract's
# op (reference_impl/ppo/advantage.py): these tests are meta, held to the same PPO-GAE-1 estimator.
def np_gae(r, v, d, last, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k}, stopping after the first done, by brute force (numpy)."""
    delta = r + gamma * (1 - d) * np.concatenate([v[1:], last[None]]) - v
    want = np.zeros_like(r)
    for t in range(r.shape[0]):
        for n in range(r.shape[1]):
            w = 1.0
            for k in range(t, r.shape[0]):
                want[t, n] += w * delta[k, n]
                if d[k, n]:
                    break
                w *= gamma * lam
    return want


# Mutant class: the [0, 1] range guard of gamma and lambda narrowed (a bound made strict), widened (1 -> 2)
# or weakened (`or` -> `and`). Both ends are valid (PPO-GAE-1); 1.5 is not, for either of them alone.
@pytest.mark.meta
@pytest.mark.clause("PPO-GAE-1")
@pytest.mark.parametrize("gamma, lam", [(0.0, 0.5), (1.0, 0.5), (0.5, 0.0), (0.5, 1.0), (1.0, 1.0)])
def test_trainer_gae_accepts_both_ends_of_gamma_and_lambda(gamma, lam):
    from reference_impl.ppo.gae import gae

    r = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.25]])
    v = np.array([[0.5, 0.5], [-1.0, 2.0], [0.75, -0.5]])
    d = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    last = np.array([9.0, -9.0])
    adv, ret = gae(*(torch.tensor(x, dtype=F64) for x in (r, v, d, last)), gamma=gamma, lam=lam)
    want = np_gae(r, v, d, last, gamma, lam)
    assert_close(adv, want, "PPO-GAE-1", what=f"GAE advantages with gamma={gamma}, lam={lam}")
    assert_close(ret, want + v, "PPO-GAE-1", what=f"GAE returns with gamma={gamma}, lam={lam}")


@pytest.mark.meta
@pytest.mark.clause("PPO-GAE-1")
@pytest.mark.parametrize("gamma, lam", [(1.5, 0.5), (0.5, 1.5)])
def test_trainer_gae_rejects_gamma_or_lambda_above_one(gamma, lam):
    from reference_impl.ppo.gae import gae

    z = torch.zeros(3, 2, dtype=F64)
    with pytest.raises(ValueError):
        gae(z, z, z, torch.zeros(2, dtype=F64), gamma=gamma, lam=lam)


# Mutant class: the shape guard's `or` -> `and`, which then rejects only when last_value is wrong too. A done
# column [T, 1] beside rewards and values [T, N] (last_value right) would broadcast silently.
@pytest.mark.meta
@pytest.mark.clause("PPO-GAE-1")
def test_trainer_gae_rejects_dones_that_only_broadcast():
    from reference_impl.ppo.gae import gae

    z, last = torch.zeros(3, 2, dtype=F64), torch.zeros(2, dtype=F64)
    with pytest.raises(ValueError):
        gae(z, z, torch.zeros(3, 1, dtype=F64), last, gamma=0.9, lam=0.9)


def _keyed(e, t, a):
    return {"episode_id": torch.tensor(e), "timestep": torch.tensor(t), "agent_id": torch.tensor(a),
            "action": torch.zeros(len(e), dtype=torch.int64)}


# Mutant classes: the pairwise key comparison reads a slice of the wrong length (`e[:-1]` -> `e[:+1]`, which
# broadcasts the FIRST episode id against every later one), seen only with three or more rows and differing
# episode ids after the first pair; the error locates the first good pair instead of the first bad one.
@pytest.mark.clause("PPO-MAPPO-1")
def test_mappo_order_checked_on_every_pair_of_episodes(ppo):
    from conformance_tests.harness import assert_rejects

    # episode 2 before episode 1 at rows 1-2 (row 0's episode 0 is below both)
    assert_rejects("PPO-MAPPO-1", ppo.raw("check_alignment"), _keyed([0, 2, 1], [0, 0, 0], [0, 0, 0]))
    # after sorting, the repeated key (1, 0, 0) sits at rows 1-2
    assert_rejects("PPO-MAPPO-1", ppo.raw("align_batch"), _keyed([1, 0, 1], [0, 0, 0], [0, 0, 0]))
    # every pair out of order (the mutant that reports the first GOOD pair finds none and fails on indexing)
    assert_rejects("PPO-MAPPO-1", ppo.raw("check_alignment"), _keyed([1, 0], [0, 0], [0, 0]))


# Mutant class: the row count taken from timestep instead of episode_id. A key field without a row axis is a
# ragged batch and must be rejected as such (naming PPO-INPUT-5), not fail on indexing its missing row axis.
@pytest.mark.clause("PPO-INPUT-5")
@pytest.mark.parametrize("field", ["timestep", "agent_id"])
def test_mappo_key_field_without_rows_rejected(ppo, field):
    from conformance_tests.harness import assert_rejects

    batch = {**_keyed([0, 0], [0, 1], [0, 0]), field: torch.tensor(0)}
    assert_rejects("PPO-INPUT-5", ppo.raw("align_batch"), batch)
