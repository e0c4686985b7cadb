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
from reference_impl._dtypes import promoted
from reference_impl._fused import with_gradients
from reference_impl.sac.backup import _check_top_p, _min_q, _select, blocked, by_blocks
from reference_impl.sac.masking import PROB_EPS, prob_clip


# ----------------------------------------------------------------------------- masks and blocks
def float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool mask as 0/1 in ``dtype``: read as bytes, which converts several times faster than bool,
    so that the fast paths can mask by multiplication (much faster than a bool ``masked_fill``)."""
    return mask.view(torch.uint8).to(dtype)


def mask_ops(mask: torch.Tensor, like: torch.Tensor):
    """``(keep, push_down)`` for a bool ``mask``: ``keep(x)`` is x on the mask and 0 elsewhere;
    ``push_down(z)`` is z on the mask and about the dtype's lowest finite value elsewhere, so that a
    softmax or log-sum-exp gives those entries exactly 0 weight. The CPU multiplies by one 0/1 float copy
    of the mask (several times faster there than bool selects); other devices use the bool mask as it is
    (a multiply promotes it inside the kernel), since there every op is a kernel launch."""
    big = torch.finfo(like.dtype).max
    if blocked(like):
        m = float_mask(mask, like.dtype)
        return (lambda x: x * m), (lambda z: z.add(m - 1.0, alpha=big))
    return (lambda x: x * mask), (lambda z: torch.where(mask, z, -big))


def masked_softmax_fast(logits: torch.Tensor, legal_mask: torch.Tensor, *, eps: float = PROB_EPS) -> torch.Tensor:
    """Fast path of :func:`masked_softmax` (no guards, fewer passes): illegal logits pushed down to about
    the dtype's lowest finite value, so the softmax's own max shift is the max over the legal logits and
    illegal entries get exactly 0, as exp(−10⁹) does in the plain formula; legal logits are untouched;
    then the same ε-clip. The differential test in conformance_tests/meta/test_sac_fastpaths.py holds it to the plain one.

    Implements: SAC-MASK-1, SAC-MASK-2.
    """
    push_down = mask_ops(legal_mask, logits)[1]
    return torch.softmax(push_down(logits), dim=-1).clamp_min(prob_clip(eps, logits.dtype))


def row_blocks(like: torch.Tensor, *, itemsize: int = 4, block_bytes: int = 1 << 20) -> list[slice]:
    """Slices of the rows of the [rows, width] tensor ``like``, about ``block_bytes`` each on the CPU (the
    fused fast paths run their many elementwise passes block by block, so each pass reads a block that
    is still in cache and every temporary stays small); one slice of every row on an accelerator."""
    rows, width = like.shape
    step = max(1, block_bytes // (itemsize * max(1, width))) if blocked(like) else max(rows, 1)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def blockwise(fn, like: torch.Tensor, *tensors, itemsize: int = 4) -> tuple[torch.Tensor, ...]:
    """``fn`` over the :func:`row_blocks` of ``tensors`` (see ``backup.by_blocks``): one pass over the whole
    batch on an accelerator, cache-sized blocks on the CPU."""
    return by_blocks(fn, row_blocks(like, itemsize=itemsize), like.shape[0], *tensors)


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

    def rows(z, m, q1r, q2r):
        pi = masked_softmax_fast(z, m, eps=eps)
        w = mask_ops(m if p >= 1.0 else _select(pi, m, p), pi)[0](pi)  # π·1[P]
        cov = w.sum(-1)
        # π and its Top-p set stay in the logits' dtype, as in the plain chain; the values are promoted
        w, log_pi, q = promoted(w, pi.log_(), _min_q(q1r, q2r))
        # the expanded SAC-TOPP-3 of _soft_value_expanded, with log π taken where π ≥ ε > 0
        v = (torch.linalg.vecdot(w, q) - alpha * torch.linalg.vecdot(w, log_pi)) / cov + alpha * torch.log(cov)
        return v, cov

    with torch.no_grad():
        return blockwise(rows, logits, logits, legal_mask, q1, q2, itemsize=8)  # the selection works in float64


# ----------------------------------------------------------------------------- the update's two heads
# Each head over [B, |A|] in one pass, row block by row block, with the gradient with respect to the
# network output computed next to the value (the loss is a sum of per-row terms, so its gradient is known
# in closed form). losses.critic_loss_total and losses.policy_loss_total are their oracle.

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
    q, y = promoted(q_all.detach(), target.detach())
    taken = q.gather(-1, idx).squeeze(-1)
    huber = F.huber_loss(taken, y, reduction="none", delta=delta).mean()
    coef = _huber_grad(taken - y, delta)  # the Huber gradient at the taken action, per row
    cql = q.new_zeros(())
    if use_cql:
        def rows_lse(qr, m):
            z = qr if m is None else mask_ops(m, qr)[1](qr)  # illegal actions leave the sum (exp = 0)
            return torch.logsumexp(z, dim=-1), torch.softmax(z, dim=-1)  # and ∂ logsumexp / ∂Q

        lse, grad = blockwise(rows_lse, q, q, legal_mask)
        grad.mul_(lam_cql)
        cql = lam_cql * (lse.mean() - taken.mean())
        coef = coef - lam_cql
    else:
        grad = torch.zeros_like(q)
    grad.scatter_add_(-1, idx, coef.unsqueeze(-1)).div_(rows)
    return with_gradients(huber + cql, [q_all], [grad]), huber, cql


def critic_heads_fused(q1_all: torch.Tensor, q2_all: torch.Tensor, actions, target, *, legal_mask=None,
                       delta: float = 1.0, lam_cql: float = 0.5, use_cql: bool = True):
    r"""Both critics' shares of :func:`critic_loss_total` and the twin minimum at the taken actions:
    ``(loss, huber_share, cql_share, q_min_taken)``, ``loss`` carrying the gradients into both outputs.
    The CPU runs :func:`critic_head_fused` once per critic, row block by row block; an accelerator stacks
    the twins and runs the same formulas once over [2, B, |A|] (half the kernel launches).

    Implements: SAC-CRITIC-2 (SAC-CRITIC-1, SAC-CQL-1), and SAC-V-1's minimum for the diagnostics.
    """
    kw = dict(legal_mask=legal_mask, delta=delta, lam_cql=lam_cql, use_cql=use_cql)
    if blocked(q1_all):
        (l1, h1, c1), (l2, h2, c2) = (critic_head_fused(q, actions, target, **kw) for q in (q1_all, q2_all))
        idx = actions.long().unsqueeze(-1)
        q_min = torch.minimum(q1_all.detach().gather(-1, idx), q2_all.detach().gather(-1, idx)).squeeze(-1)
        return l1 + l2, h1 + h2, c1 + c2, q_min
    _checks.index_in_range(actions, q1_all.shape[-1], "SAC-CRITIC-2", "actions")
    rows = q1_all.shape[0]
    q, y = promoted(torch.stack((q1_all.detach(), q2_all.detach())), target.detach())  # q: [2, B, |A|]
    idx = actions.long().view(1, rows, 1).expand(2, rows, 1)
    taken = q.gather(-1, idx).squeeze(-1)  # [2, B]
    huber = 2 * F.huber_loss(taken, y.expand(2, rows), delta=delta)  # each critic's mean, summed
    coef = _huber_grad(taken - y, delta)
    if use_cql:
        z = q if legal_mask is None else mask_ops(legal_mask, q)[1](q)  # the [B, |A|] mask broadcasts
        grad = torch.softmax(z, dim=-1).mul_(lam_cql)  # ∂ logsumexp / ∂Q, scaled
        cql = (2 * lam_cql) * (torch.logsumexp(z, dim=-1) - taken).mean()  # each critic's mean, summed
        coef = coef - lam_cql
    else:
        grad, cql = torch.zeros_like(q), q.new_zeros(())
    grad.scatter_add_(-1, idx, coef.unsqueeze(-1)).div_(rows)
    return with_gradients(huber + cql, [q1_all, q2_all], grad), huber, cql, taken.amin(0)


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
    (z_all, q1, q2), idx = promoted(logits.detach(), q1, q2), actions.long().unsqueeze(-1)
    demo = is_demo.to(z_all.dtype)
    n_demo = demo.sum().clamp_min(1.0)
    bc_coef = -lam_bc * demo / n_demo  # ∂L_BC/∂π(a*) = bc_coef / π(a*)

    def rows_grad(z, m, q1r, q2r, idx_r, bc_r):
        keep, push_down = mask_ops(m, z)
        s = torch.softmax(push_down(z), dim=-1)  # SAC-MASK-1 (illegal: exactly 0)
        pi = s.clamp_min(eps)  # SAC-MASK-2
        log_pi = pi.log()
        w = keep(pi)  # π on the legal set, 0 elsewhere
        q = torch.minimum(q1r, q2r)
        q = q.detach() if q.requires_grad else q  # the critics' values are constants of this loss
        neg_ent = torch.linalg.vecdot(w, log_pi)  # −H(π) per row (SAC-ENT-2)
        soft = torch.linalg.vecdot(w, q)
        taken = log_pi.gather(-1, idx_r).squeeze(-1)
        g = keep(log_pi.add_(1.0).mul_(alpha).sub_(q)).div_(rows)  # ∂(E_o L_π)/∂π on the legal set
        g.scatter_add_(-1, idx_r, (bc_r * torch.exp(-taken))[:, None])  # SAC-BC-1: bc_coef / π(a*)
        g = mask_ops(s >= eps, g)[0](g)  # the clip's pass-through
        return s.mul_(g.sub_(torch.linalg.vecdot(g, s)[:, None])), soft, neg_ent, taken  # softmax backward

    grad, soft, neg_ent, log_taken = blockwise(rows_grad, z_all, z_all, legal_mask, q1, q2, idx, bc_coef)
    pol = (alpha * neg_ent - soft).mean()  # E_o Σ π (α log π − q)
    ent = neg_ent.neg()
    bc = torch.dot(log_taken, bc_coef)  # λ · mean over demo rows of −log π(a*)
    return with_gradients(pol + bc, [logits], [grad]), pol, bc, ent
