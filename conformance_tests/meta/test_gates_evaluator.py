"""The go-live gates' evaluator (``rlconform.spec.gates``), one test per gate clause of spec/.

It passes a figure on the right side of the threshold and fails one on the wrong side, so a run's metrics
are judged exactly as the clause says; a metric that was not measured is missing, never passed. Across
several runs, the pooled figure passes only when every run passes.
"""
from __future__ import annotations

import pytest
from rlconform.spec import gates

from conformance_tests.harness import assert_that
from conformance_tests.test_defaults import _SPEC

_GATES = [c for c in _SPEC.clauses.values() if c.kind == "gate"]


def _inside_and_outside(op, thr):
    """A figure that satisfies the gate and one that violates it, derived from the threshold alone."""
    if op == "in":
        lo, hi = thr
        return (lo + hi) / 2, hi * 2 + 1
    step = max(abs(thr) * 0.5, 1e-3)
    return {
        "<": (thr - step, thr), "<=": (thr, thr + step), ">": (thr + step, thr),
        ">=": (thr, thr - step), "==": (thr, thr + 1),
    }[op]


@pytest.mark.meta
@pytest.mark.parametrize("clause", [pytest.param(c, id=c.id, marks=pytest.mark.clause(c.id)) for c in _GATES])
def test_gate_verdicts(clause):
    g = clause.gate
    good, bad = _inside_and_outside(g["op"], g["threshold"])
    agg = g.get("aggregate", "last")
    # per-update records whose aggregate is exactly the figure: a constant series
    for figure, want in ((good, "pass"), (bad, "fail")):
        recs = [{g["metric"]: figure} for _ in range(4)]
        got = [r for r in gates.evaluate(recs, clause.family) if r.clause.id == clause.id][0]
        assert_that(got.verdict == want, clause.id, f"{got.verdict} for {g['metric']}={figure} ({agg})", want)
    missing = [r for r in gates.evaluate([{"other": 1.0}], clause.family) if r.clause.id == clause.id][0]
    assert_that(missing.verdict == "missing", clause.id, missing.verdict, "missing when the metric is absent")


@pytest.mark.meta
@pytest.mark.parametrize("clause", [pytest.param(c, id=c.id, marks=pytest.mark.clause(c.id)) for c in _GATES
                                    if c.gate.get("aggregate", "last").endswith("_last_half")])
def test_a_gate_does_not_pass_what_it_did_not_measure(clause):
    """A null (how loggers write NaN) fails; a metric missing from the second half of the run,
    or a run too short to have a second half, is missing, never passed on the first half's values."""
    g = clause.gate
    good, _ = _inside_and_outside(g["op"], g["threshold"])

    def verdict(recs):
        return [r for r in gates.evaluate(recs, clause.family) if r.clause.id == clause.id][0].verdict

    run = [{"update": u, g["metric"]: good} for u in range(20)]
    assert_that(verdict(run) == "pass", clause.id, verdict(run), "pass on a constant good series")
    nulled = [dict(r) for r in run]
    nulled[3][g["metric"]] = None
    assert_that(verdict(nulled) == "fail", clause.id, verdict(nulled), "fail: a null value is a NaN")
    stopped = [dict(r) if r["update"] < 10 else {"update": r["update"]} for r in run]
    assert_that(verdict(stopped) == "missing", clause.id, verdict(stopped), "missing: not logged in the second half")
    assert_that(verdict(run[:1]) == "missing", clause.id, verdict(run[:1]), "missing: one record has no second half")


# ---------------------------------------------------------------------------------------------- several runs
def _curve(values, key="critic_loss"):
    return [{"update": i + 1, key: v} for i, v in enumerate(values)]


@pytest.mark.meta
@pytest.mark.clause("SAC-GATE-2")
def test_divergence_flags_non_finite_losses_and_a_rising_critic_loss():
    falling = _curve([4.0, 3.0, 2.5, 2.0, 1.5, 1.2, 1.0, 0.9])
    assert gates.divergence(falling, losses=("critic_loss",), trend="critic_loss") is None
    # first quarter [4, 3] (median 3.5), last quarter [2, 5] (median 3.5): not above, so not diverged
    assert gates.divergence(_curve([4.0, 3.0, 1.0, 1.0, 1.0, 1.0, 2.0, 5.0]), losses=(), trend="critic_loss") is None
    rising = _curve([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0])  # medians 1.0 then 2.0
    assert "rose" in gates.divergence(rising, losses=(), trend="critic_loss")
    nan = falling[:3] + [{"update": 4, "critic_loss": 1.0, "policy_loss": float("nan")}] + falling[4:]
    assert "policy_loss" in gates.divergence(nan, losses=("critic_loss", "policy_loss"), trend="critic_loss")
    assert "no trend" in gates.divergence(falling[:3], losses=(), trend="critic_loss")


@pytest.mark.meta
@pytest.mark.clause("SAC-GATE-1", "SAC-GATE-4")
def test_pooled_figures_pass_only_when_every_run_passes():
    ok = [{"alpha": 0.5, "illegal_rate": 0.0}]
    bad_alpha = [{"alpha": 3.0, "illegal_rate": 0.0}]
    pooled = gates.pooled_figures([ok, bad_alpha, ok], "sac")
    assert pooled["alpha"] == 3.0 and pooled["illegal_rate"] == 0.0  # the failing run's figure is the pooled one
    verdicts = {r.clause.id: r.verdict for r in gates.evaluate([pooled], "sac")}
    assert verdicts["SAC-GATE-1"] == "fail" and verdicts["SAC-GATE-4"] == "pass"
    assert gates.pooled_figures([ok, ok], "sac")["alpha"] == 0.5
    # of two failing runs the pooled figure is the one further from the threshold (2 < 3 above the range)
    assert gates.pooled_figures([[{"alpha": 2.5}], bad_alpha, [{"alpha": 1e-6}]], "sac")["alpha"] == 3.0
    gains = [[{"ood_gain_pp": g}] for g in (1.2, 0.0, 12.0)]  # ">= 10": the smallest gain is the worst
    assert gates.pooled_figures(gains, "sac")["ood_gain_pp"] == 0.0


@pytest.mark.meta
@pytest.mark.clause("SAC-GATE-8")
def test_ablation_drop_is_in_percentage_points():
    drops = gates.ablation_drops(0.30, {"no_bc": 0.10, "fixed_alpha": 0.32})
    assert drops["no_bc"] == pytest.approx(20.0) and drops["fixed_alpha"] == pytest.approx(-2.0)
    rec = {"ablation_drop_pp": min(drops.values())}  # every ablation must cost 5 points: one gain fails it
    assert {r.clause.id: r.verdict for r in gates.evaluate([rec], "sac")}["SAC-GATE-8"] == "fail"
