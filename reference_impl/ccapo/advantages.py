r"""Decoupled rewards and the dual-stream advantage (seed 004 §4, §5, §7.1)."""
from __future__ import annotations

import torch

from reference_impl import _checks


def _tensor(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.is_floating_point():
        _checks.finite(t, "CCAPO-INPUT-1", name)
    return t


def macro_return(success, n_steps, *, r_terminal: float = 10.0, r_penalty: float = -0.1) -> torch.Tensor:
    r"""Time-penalised episode return.

    R_\tau = \mathbb{1}[\text{success}]\,R_{terminal} + N_{step}\,R_{penalty}

    N_step counts every step, looped ones included. Implements: CCAPO-R-1, CCAPO-LOOP-2
    """
    s, n = _tensor(success, "success"), _tensor(n_steps, "n_steps")
    _checks.same_shape("CCAPO-INPUT-3", success=s, n_steps=n)
    if _checks._on() and bool((n < 0).any()):
        raise ValueError("[CCAPO-INPUT-2] n_steps is negative")
    term = torch.where(s.bool(), torch.tensor(float(r_terminal), dtype=torch.float64),
                       torch.tensor(0.0, dtype=torch.float64))
    return term + n.to(torch.float64) * r_penalty


def macro_advantage(returns, *, eps: float = 1e-8) -> torch.Tensor:
    r"""GRPO z-score of R_τ within the group of one prompt (last dim), population std.

    A^{(i)}_{macro} = \frac{R^{(i)} - \mathrm{mean}_j R^{(j)}}{\mathrm{std}_j R^{(j)} + \epsilon}

    A group whose returns are all equal (a single member included) gets exactly 0: the mean of
    equal floats can round away from them, which would otherwise leave ±1e-9 noise.
    Implements: CCAPO-MACRO-1, CCAPO-MACRO-2
    """
    r = _tensor(returns, "returns")
    if not r.is_floating_point():
        r = r.to(torch.float64)
    if r.dim() == 0 or r.shape[-1] == 0:
        raise ValueError("[CCAPO-INPUT-3] returns needs a non-empty group dimension")
    mean = r.mean(-1, keepdim=True)
    std = r.std(-1, unbiased=False, keepdim=True) if r.shape[-1] > 1 else torch.zeros_like(mean)
    z = (r - mean) / (std + eps)
    flat = (r.amax(-1, keepdim=True) == r.amin(-1, keepdim=True))
    return torch.where(flat, torch.zeros_like(z), z)


def loop_mask(fingerprint_ids) -> torch.Tensor:
    r"""Steps that close a loop: A→A (same as t−1) or A→B→A (same as t−2).

    Implements: CCAPO-LOOP-1
    """
    f = torch.as_tensor(fingerprint_ids)
    if f.is_floating_point() or f.dim() == 0:
        raise ValueError("[CCAPO-INPUT-3] fingerprint_ids must be an integer tensor [..., T]")
    out = torch.zeros(f.shape, dtype=torch.bool, device=f.device)  # on the ids' device: the trainer's
    if f.shape[-1] >= 2:
        out[..., 1:] |= f[..., 1:] == f[..., :-1]
    if f.shape[-1] >= 3:
        out[..., 2:] |= f[..., 2:] == f[..., :-2]
    return out


def micro_reward(q, edge_seen, is_loop) -> torch.Tensor:
    r"""R_micro(t) = Q_STDB(edge_t), or 0 for a missing edge or a looped step.

    Implements: CCAPO-MICRO-1, CCAPO-LOOP-2
    """
    q = _tensor(q, "q")
    e, l = torch.as_tensor(edge_seen).bool(), torch.as_tensor(is_loop).bool()
    _checks.same_shape("CCAPO-INPUT-3", q=q, edge_seen=e, is_loop=l)
    return torch.where(e & ~l, q, torch.zeros_like(q))


def micro_raw_advantage(r_micro, v_bar, anchor_seen) -> torch.Tensor:
    r"""Historical-baseline advantage: :math:`A^{raw} = R_{micro} - \bar V(S_{anchor})`, 0 for an unseen
    anchor.

    Implements: CCAPO-MICRO-2
    """
    r, v = _tensor(r_micro, "r_micro"), _tensor(v_bar, "v_bar")
    a = torch.as_tensor(anchor_seen).bool()
    _checks.same_shape("CCAPO-INPUT-3", r_micro=r, v_bar=v, anchor_seen=a)
    return torch.where(a, r - v, torch.zeros_like(r))


def micro_advantage(raw, *, sigma_min: float = 0.1, valid=None) -> torch.Tensor:
    r"""Batch-level z-score of the raw micro advantage with a floor on the std.

    A_{micro} = \frac{A^{raw} - \mathrm{mean}_{batch}}{\max(\mathrm{std}_{batch}, \sigma_{min})}

    Population std over the valid steps of the whole batch. Implements: CCAPO-MICRO-3
    """
    x = _tensor(raw, "raw")
    _checks.in_range(sigma_min, 0.0, float("inf"), "CCAPO-INPUT-5", "sigma_min", hi_open=True)
    m = torch.ones_like(x, dtype=torch.bool) if valid is None else torch.as_tensor(valid).bool()
    _checks.same_shape("CCAPO-INPUT-3", raw=x, valid=m)
    if not bool(m.any()):
        return torch.zeros_like(x)
    v = x[m]
    mean = v.mean()
    std = ((v - mean) ** 2).mean().sqrt()
    z = (x - mean) / torch.clamp(std, min=sigma_min)
    return torch.where(m, z, torch.zeros_like(z))


def fuse_advantages(a_macro, a_micro, *, beta: float = 0.5) -> torch.Tensor:
    r""":math:`A_{total}(t) = A^{(i)}_{macro} + \beta A^{(i,t)}_{micro}`.

    Implements: CCAPO-FUSE-1
    """
    ma, mi = _tensor(a_macro, "a_macro"), _tensor(a_micro, "a_micro")
    if mi.dim() != ma.dim() + 1 or mi.shape[: ma.dim()] != ma.shape:
        raise ValueError(f"[CCAPO-INPUT-3] a_macro {tuple(ma.shape)} does not lead a_micro {tuple(mi.shape)}")
    _checks.in_range(beta, 0.0, float("inf"), "CCAPO-INPUT-5", "beta", lo_open=False, hi_open=True)
    return ma.unsqueeze(-1) + beta * mi
