"""The reference's clipped-surrogate minimum at a floating-point tie (reference_impl/_clip.py).

Just outside the clip range the minimum is the unclipped product r·A (for A > 0 below 1 − ε, for A < 0
above 1 + ε), and its slope in r is A. For a ratio an ulp past the edge, r·A can round to the clipped
product (1 ∓ ε)·A: an elementwise minimum then splits the gradient of the tie and returns A/2. The
reference takes the unclipped piece at a tie, in PPO's plain loss, in its fused closed form and in CCAPO's
loss. The conformance tests accept either at such a point; these hold the reference to the full slope.
"""
from __future__ import annotations

import pytest
import torch

from conformance_tests.harness import assert_close
from reference_impl._clip import pessimistic_weight
from reference_impl.ccapo.losses import policy_loss
from reference_impl.ppo.losses import clipped_policy_loss

pytestmark = pytest.mark.meta
F64 = torch.float64


def _outside_tie(r: torch.Tensor, a: torch.Tensor, eps: float) -> torch.Tensor:
    """Where r lies outside [1 − ε, 1 + ε] and r·A is the same float64 number as clip(r)·A."""
    lo, hi = 1.0 - eps, 1.0 + eps
    return (r * a == r.clamp(lo, hi) * a) & ((r < lo) | (r > hi))


def _rounding_ties(rho: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ratio, advantage) pairs with the ratio outside [1 − ε, 1 + ε] on the side where the minimum is r·A,
    whose two products tie. ``rho`` are candidate ratios; advantages from a grid."""
    sign = torch.where(rho < 1.0 - eps, 1.0, -1.0).to(F64)
    a = torch.linspace(0.1, 3.0, 3001, dtype=F64)
    r, a = torch.broadcast_tensors(rho[:, None], sign[:, None] * a[None, :])
    r, a = r.reshape(-1), a.reshape(-1)
    tie = _outside_tie(r, a, eps)
    assert int(tie.sum()) >= 20, "too few rounding ties to test"
    return r[tie][:200], a[tie][:200]


def _neighbours(x: torch.Tensor, toward: torch.Tensor, k: int) -> list[torch.Tensor]:
    """The k successive float64 neighbours of ``x`` toward ``toward`` (elementwise)."""
    out = []
    for _ in range(k):
        x = torch.nextafter(x, toward)
        out.append(x)
    return out


def _edges(eps: float) -> torch.Tensor:
    return torch.tensor([1.0 - eps, 1.0 + eps], dtype=F64)


OUTWARD = torch.tensor([-torch.inf, torch.inf], dtype=F64)  # below 1 − ε, above 1 + ε


@pytest.mark.clause("PPO-LOSS-1")
@pytest.mark.parametrize("eps", [0.2, 0.01, 0.3])
def test_ppo_loss_keeps_the_unclipped_slope_at_a_rounding_tie(eps):
    r, a = _rounding_ties(torch.cat(_neighbours(_edges(eps), OUTWARD, 3)), eps)
    x = r.clone().requires_grad_()
    clipped_policy_loss(x, a, clip_eps=eps).backward()
    assert_close(x.grad, -a / len(a), "PPO-LOSS-1", what="d loss / d r at a tie an ulp outside the clip range")


@pytest.mark.clause("PPO-LOSS-1")
@pytest.mark.parametrize("eps", [0.2, 0.01])
def test_the_fused_branch_weight_is_the_plain_gradient_on_and_around_the_edges(eps):
    """At the edges themselves (an in-range tie), an ulp or two either side (ties or not) and far off, with
    both signs of A: the closed-form weight times −A/n is the plain loss's autograd gradient in r."""
    g = torch.Generator().manual_seed(5)
    near = [_edges(eps)] + _neighbours(_edges(eps), OUTWARD, 2) + _neighbours(_edges(eps), -OUTWARD, 2)
    r = torch.cat(near + [torch.tensor([0.3, 1.0, 2.5], dtype=F64)]).repeat_interleave(200)
    a = torch.rand(len(r), generator=g, dtype=F64) * 6 - 3
    x = r.clone().requires_grad_()
    clipped_policy_loss(x, a, clip_eps=eps).backward()
    lo, hi = 1.0 - eps, 1.0 + eps
    u, c = r * a, r.clamp(lo, hi) * a
    w = pessimistic_weight(u, c, ((r >= lo) & (r <= hi)).to(F64))
    assert bool((u == c).any()), "no tie in the sample"
    assert_close(w * -a / len(a), x.grad, "PPO-LOSS-1", what="closed-form weight against the plain autograd")


@pytest.mark.clause("CCAPO-PPO-1")
def test_ccapo_loss_keeps_the_unclipped_slope_at_a_rounding_tie():
    """One-step trajectories, β = 0: d loss / d logp_new = −ρA / B wherever the minimum is ρA."""
    eps = 0.01
    log_edges = _edges(eps).log()
    rho, a = _rounding_ties(torch.cat([log_edges] + _neighbours(log_edges, OUTWARD, 40)).exp(), eps)
    logp = rho.log()
    rho = logp.exp()  # the ratio the loss sees may be an ulp away: keep the pairs that still tie there
    keep = _outside_tie(rho, a, eps)
    assert int(keep.sum()) >= 10, "too few ties survive the log round trip"
    logp, rho, a = logp[keep][:, None], rho[keep], a[keep][:, None]
    x = logp.clone().requires_grad_()
    zeros, mask = torch.zeros_like(logp), torch.ones_like(logp, dtype=torch.bool)
    policy_loss(x, zeros, x.detach(), a, mask, clip_eps=eps, beta_kl=0.0)["loss"].backward()
    assert_close(x.grad.squeeze(1), -rho * a.squeeze(1) / len(rho), "CCAPO-PPO-1",
                 what="d loss / d logp_new at a tie an ulp outside the clip range")
