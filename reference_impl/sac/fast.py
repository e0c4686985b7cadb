r"""The SAC update's fast paths, each the same result as the plain formulas it names (its oracle).

They trade readability for speed on the CPU: one pass over [B, |A|] where the plain chain takes several,
masking by multiplication with a 0/1 float mask, row blocks that stay in cache, and gradients computed in
closed form next to the values. ``conformance_tests/meta/test_sac_fastpaths.py`` holds each to its oracle,
values and gradients, on every device; the plain formulas in ``masking``, ``backup`` and ``losses`` stay the
specification's text.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_impl import _checks
from reference_impl.sac.backup import _check_top_p, _min_q, _select, blocked
from reference_impl.sac.masking import PROB_EPS


# ----------------------------------------------------------------------------- masks and blocks
def float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0/1 in ``dtype``: read as bytes, which converts several times faster than bool,
    so that the fast paths can mask by multiplication (much faster than a bool ``masked_fill``)."""
    return mask.view(torch.uint8).to(dtype)


def masked_softmax_fast(logits: torch.Tensor, legal_mask: torch.Tensor, *, eps: float = PROB_EPS) -> torch.Tensor:
    """Fast path of :func:`masked_softmax` (no guards, fewer passes): illegal logits pushed down by the
    dtype's largest finite value, so the softmax's own max shift is the max over the legal logits and
    illegal entries get exactly 0, as exp(−10⁹) does in the plain formula; legal logits are untouched
    (z + 0); then the same ε-clip. The differential test in conformance_tests/meta/test_sac_fastpaths.py holds it to the plain one.

    Implements: SAC-MASK-1, SAC-MASK-2.
    """
    fi = torch.finfo(logits.dtype)
    probs = torch.softmax(logits.add(float_mask(legal_mask, logits.dtype).sub_(1.0), alpha=fi.max), dim=-1)
    return probs.clamp_min(max(eps, fi.tiny))


def row_blocks(like: torch.Tensor, *, itemsize: int = 4, block_bytes: int = 1 << 20) -> list[slice]:
    """Slices of the rows of the [rows, width] tensor ``like``, about ``block_bytes`` each on the CPU (the
    fused fast paths run their many elementwise passes block by block, so each pass reads a block that
    is still in cache and every temporary stays small); one slice of every row on an accelerator."""
    rows, width = like.shape
    step = max(1, block_bytes // (itemsize * max(1, width))) if blocked(like) else max(rows, 1)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


# ----------------------------------------------------------------------------- the soft backup
def top_p_backup_fused(logits, q1, q2, legal_mask, *, alpha, p: float, eps: float):
    r"""Fast path of the whole soft backup from next-state logits, row block by row block:
    π' = masked softmax (SAC-MASK-1/2), P = Top-p set (SAC-TOPP-1), \hat V_soft (SAC-TOPP-3) and the
    Top-p coverage Σ_P π' (SAC-TOPP-4 monitor), without any [B, |A|] temporary. Returns
    ``(v_next, coverage)`` per row; no gradient. The plain chain (``masked_softmax``,
    ``top_p_soft_value``, ``top_p_select``) is its oracle (conformance_tests/meta/test_sac_fastpaths.py).

    Implements: SAC-TOPP-3 (with SAC-MASK-1/2, SAC-TOPP-1).
    """
    _check_top_p(logits, legal_mask, p, "SAC-TOPP-3")
    rows, width = logits.shape
    v = logits.new_empty(rows)
    cov = logits.new_empty(rows)
    with torch.no_grad():
        for r in row_blocks(logits, itemsize=8):  # the selection works in float64
            m = legal_mask[r]
            pi = masked_softmax_fast(logits[r], m, eps=eps)
            sel = m if p >= 1.0 else _select(pi, m, p)
            w = pi * float_mask(sel, pi.dtype)  # π·1[P]
            z = w.sum(-1)
            cov[r] = z
            # the expanded SAC-TOPP-3 of _soft_value_expanded, with log π taken where π ≥ ε > 0
            v[r] = (torch.linalg.vecdot(w, _min_q(q1[r], q2[r])) - alpha * torch.linalg.vecdot(w, pi.log_())) / z \
                + alpha * torch.log(z)
    return v, cov


# ----------------------------------------------------------------------------- the update's two heads
# Each head over [B, |A|] in one pass, row block by row block, with the gradient with respect to the
# network output computed next to the value (the loss is a sum of per-row terms, so its gradient is known
# in closed form). losses.critic_loss_total and losses.policy_loss_total are their oracle.

class _WithGrad(torch.autograd.Function):
    """A scalar whose gradient with respect to ``x`` was computed with it: backward returns
    ``grad · upstream`` (``grad`` is consumed, so the graph supports a single backward)."""

    @staticmethod
    def forward(ctx, x, value, grad):
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        return grad.mul_(upstream), None, None


def _huber_grad(d: torch.Tensor, delta: float) -> torch.Tensor:
    return d.clamp(-delta, delta)  # ∂Huber_δ(d)/∂d


def critic_head_fused(q_all: torch.Tensor, actions, target, *, legal_mask=None, delta: float = 1.0,
                      lam_cql: float = 0.5, use_cql: bool = True):
    r"""Fast path of one critic's share of :func:`critic_loss_total`:
    E_B Huber_δ(Q(o,a) − y) + L_CQL(φ), CQL's log-sum-exp over the legal set. Returns
    ``(loss, huber_share, cql_share)``; ``loss`` carries the gradient into ``q_all``:
    (Huber'(Q(o,a) − y) − λ 1[a]) / B at the taken action plus λ softmax_legal(Q) / B (CQL).

    Implements: SAC-CRITIC-2 (SAC-CRITIC-1, SAC-CQL-1).
    """
    _checks.index_in_range(actions, q_all.shape[-1], "SAC-CRITIC-2", "actions")
    rows = q_all.shape[0]
    idx = actions.long().unsqueeze(-1)
    q = q_all.detach()
    taken = q.gather(-1, idx).squeeze(-1)
    huber = F.huber_loss(taken, target.detach(), reduction="none", delta=delta).mean()
    coef = _huber_grad(taken - target.detach(), delta)  # the Huber gradient at the taken action, per row
    grad = torch.zeros_like(q)
    cql = q.new_zeros(())
    if use_cql:
        lse, big = q.new_empty(rows), torch.finfo(q.dtype).max
        for r in row_blocks(q):
            z = q[r] if legal_mask is None else q[r].add(float_mask(legal_mask[r], q.dtype).sub_(1.0), alpha=big)
            lse[r] = torch.logsumexp(z, dim=-1)  # illegal actions leave the sum (pushed to -max: exp = 0)
            torch.softmax(z, dim=-1, out=grad[r])  # ∂ logsumexp / ∂Q
        grad.mul_(lam_cql)
        cql = lam_cql * (lse.mean() - taken.mean())
        coef = coef - lam_cql
    grad.scatter_add_(-1, idx, coef.unsqueeze(-1)).div_(rows)
    return _WithGrad.apply(q_all, huber + cql, grad), huber, cql


def policy_head_fused(logits, q1, q2, legal_mask, actions, is_demo, *, alpha, lam_bc: float = 0.1,
                      eps: float | None = None):
    r"""Fast path of option A :func:`policy_loss_total` from the policy *logits* (the masked softmax
    and its ε-clip included): L_π = E_o Σ_{A(s)} π (α log π − min Q) plus L_BC. Returns
    ``(loss, policy_share, bc_share, entropy_rows)``: ``loss`` carries the gradient into ``logits``;
    ``entropy_rows`` is H(π) per row (SAC-ENT-2), detached.

    With g = ∂L/∂π (legal entries: (α (log π + 1) − q) / B; at a demo's action also −λ/(n_demo π)),
    the ε-clip passes g where softmax ≥ ε and the softmax maps it to s ⊙ (g − ⟨g, s⟩).

    Implements: SAC-POL-3 (SAC-POL-1, SAC-BC-1, SAC-MASK-1/2, SAC-ENT-2).
    """
    _checks.bool_mask(is_demo, "SAC-BC-1", "is_demo")
    _checks.index_in_range(actions, logits.shape[-1], "SAC-BC-1", "actions")
    rows = logits.shape[0]
    eps = max(PROB_EPS if eps is None else eps, torch.finfo(logits.dtype).tiny)
    z_all, idx, big = logits.detach(), actions.long().unsqueeze(-1), torch.finfo(logits.dtype).max
    demo = is_demo.to(logits.dtype)
    n_demo = demo.sum().clamp_min(1.0)
    bc_coef = -lam_bc * demo / n_demo  # ∂L_BC/∂π(a*) = bc_coef / π(a*)
    grad = torch.empty_like(z_all)
    soft, ent = z_all.new_empty(rows), z_all.new_empty(rows)
    log_taken = z_all.new_empty(rows)
    for r in row_blocks(z_all):
        legal = float_mask(legal_mask[r], z_all.dtype)
        s = torch.softmax(z_all[r].add(legal - 1.0, alpha=big), dim=-1)  # SAC-MASK-1 (illegal: exactly 0)
        pi = s.clamp_min(eps)  # SAC-MASK-2
        log_pi = pi.log()
        w = pi.mul_(legal)  # π on the legal set, 0 elsewhere (pi is not needed any more)
        q = torch.minimum(q1[r], q2[r]).detach()
        ent[r] = -torch.linalg.vecdot(w, log_pi)  # SAC-ENT-2
        soft[r] = torch.linalg.vecdot(w, q)
        taken = log_pi.gather(-1, idx[r]).squeeze(-1)
        log_taken[r] = taken
        g = log_pi.add_(1.0).mul_(alpha).sub_(q).mul_(legal).div_(rows)  # ∂(E_o L_π)/∂π on the legal set
        g.scatter_add_(-1, idx[r], (bc_coef[r] * torch.exp(-taken))[:, None])  # SAC-BC-1: bc_coef / π(a*)
        g.mul_(float_mask(s >= eps, g.dtype))  # the clip's pass-through
        torch.mul(s, g.sub_(torch.linalg.vecdot(g, s)[:, None]), out=grad[r])  # softmax backward
    pol = (-(alpha * ent + soft)).mean()  # E_o Σ π (α log π − q)
    bc = lam_bc * (-(log_taken * demo)).sum() / n_demo
    return _WithGrad.apply(logits, pol + bc, grad), pol, bc, ent
