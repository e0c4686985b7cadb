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


def _rounding_ties(rho: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ratio, advantage) pairs with the ratio outside [1 − ε, 1 + ε] on the side where the minimum is r·A,
    whose two products are the same float64 number. ``rho`` are candidate ratios; advantages from a grid."""
    lo, hi = 1.0 - eps, 1.0 + eps
    sign = torch.where(rho < lo, 1.0, -1.0).to(F64)
    a = torch.linspace(0.1, 3.0, 3001, dtype=F64)
    r, a = torch.broadcast_tensors(rho[:, None], sign[:, None] * a[None, :])
    r, a = r.reshape(-1), a.reshape(-1)
    tie = (r * a == r.clamp(lo, hi) * a) & ((r < lo) | (r > hi))
    assert int(tie.sum()) >= 20, "too few rounding ties to test"
    return r[tie][:200], a[tie][:200]


def _ulps_outside(eps: float, k: int = 3) -> torch.Tensor:
    """The k float64 ratios just below 1 − ε and the k just above 1 + ε."""
    out = []
    for edge, way in ((1.0 - eps, -1.0), (1.0 + eps, 1.0)):
        x = torch.tensor(edge, dtype=F64)
        for _ in range(k):
            x = torch.nextafter(x, torch.tensor(way * torch.inf, dtype=F64))
            out.append(x.clone())
    return torch.stack(out)


@pytest.mark.clause("PPO-LOSS-1")
@pytest.mark.parametrize("eps", [0.2, 0.01, 0.3])
def test_ppo_loss_keeps_the_unclipped_slope_at_a_rounding_tie(eps):
    r, a = _rounding_ties(_ulps_outside(eps), eps)
    x = r.clone().requires_grad_()
    clipped_policy_loss(x, a, clip_eps=eps).backward()
    assert_close(x.grad, -a / len(a), "PPO-LOSS-1", what="d loss / d r at a tie an ulp outside the clip range")


@pytest.mark.clause("PPO-LOSS-1")
@pytest.mark.parametrize("eps", [0.2, 0.01])
def test_the_fused_branch_weight_is_the_plain_gradient_on_and_around_the_edges(eps):
    """At the edges themselves (an in-range tie), an ulp or two either side (ties or not) and far off, with
    both signs of A: the closed-form weight times −A/n is the plain loss's autograd gradient in r."""
    g = torch.Generator().manual_seed(5)
    edges = torch.tensor([1.0 - eps, 1.0 + eps], dtype=F64)
    near = [edges]
    for way in (-torch.inf, torch.inf):
        x = edges.clone()
        for _ in range(2):
            x = torch.nextafter(x, torch.full_like(x, way))
            near.append(x.clone())
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
    start = torch.log(torch.tensor([1.0 - eps, 1.0 + eps], dtype=F64))
    steps = [start]
    for _ in range(40):
        steps.append(torch.nextafter(steps[-1], torch.tensor([-torch.inf, torch.inf], dtype=F64)))
    new = torch.cat(steps)
    rho, a = _rounding_ties(new.exp(), eps)
    logp = rho.log()
    rho = logp.exp()  # the ratio the loss sees may be an ulp away: keep the pairs that still tie there
    keep = (rho * a == rho.clamp(1 - eps, 1 + eps) * a) & ((rho < 1 - eps) | (rho > 1 + eps))
    assert int(keep.sum()) >= 10, "too few ties survive the log round trip"
    logp, rho, a = logp[keep][:, None], rho[keep], a[keep][:, None]
    x = logp.clone().requires_grad_()
    zeros, mask = torch.zeros_like(logp), torch.ones_like(logp, dtype=torch.bool)
    policy_loss(x, zeros, x.detach(), a, mask, clip_eps=eps, beta_kl=0.0)["loss"].backward()
    assert_close(x.grad.squeeze(1), -rho * a.squeeze(1) / len(rho), "CCAPO-PPO-1",
                 what="d loss / d logp_new at a tie an ulp outside the clip range")
