r"""Aggregation of a [B, T] per-token loss into a scalar, in the modes RL-for-LLM libraries offer.

The seed's loss (§9, appendix C) is ``token-mean``: one mean over every response token of the
batch. Libraries also average per sequence first (``seq-mean-token-mean``, ``seq-mean-token-sum``)
or sum (``token-sum``); which tokens weigh how much differs between the modes, so a loss that
silently uses another mode than the one configured trains differently.
"""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl.isreshape._guards import work_dtype

MASK_EPS = 1e-8  # the seed's guard in Σm + ε (ISR-LOSS-1)
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum")


def _seq_mean(per_seq: torch.Tensor, tokens_per_seq: torch.Tensor) -> torch.Tensor:
    """Mean over the rows that hold at least one token (empty rows are not sequences)."""
    live = (tokens_per_seq > 0).to(per_seq.dtype)
    return (per_seq * live).sum() / live.sum()


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, *, mode: str = "token-mean") -> torch.Tensor:
    r"""token-mean Σ l·m / (Σ m + ε); seq-mean-token-mean mean_b Σ_t l·m / Σ_t m; seq-mean-token-sum
    mean_b Σ_t l·m; token-sum Σ l·m. Masked-out entries are selected away, never multiplied in.

    Implements: ISR-AGG-1 (bad input: ISR-INPUT-1, ISR-INPUT-2).
    """
    if mode not in MODES:
        raise ValueError(f"[ISR-AGG-1] unknown aggregation mode {mode!r}; expected one of {MODES}")
    _checks.same_shape("ISR-INPUT-1", loss_mat=loss_mat, mask=mask)
    if loss_mat.dim() < 1:
        raise ValueError("[ISR-INPUT-1] loss_mat needs a token axis")
    m = mask.bool() if mask.dtype == torch.bool else mask != 0
    if _checks._on() and not bool(m.any()):
        raise ValueError("[ISR-INPUT-1] the mask selects no token")
    wd = work_dtype(loss_mat)
    _checks.finite(torch.where(m, loss_mat, torch.zeros_like(loss_mat)), "ISR-INPUT-2", "loss_mat")
    l = torch.where(m, loss_mat.to(wd), torch.zeros((), dtype=wd, device=loss_mat.device))  # ISR-AGG-1
    per_seq, tokens = l.sum(-1), m.sum(-1)
    if mode == "token-mean":
        out = l.sum() / (tokens.sum().to(wd) + MASK_EPS)
    elif mode == "token-sum":
        out = l.sum()
    elif mode == "seq-mean-token-sum":
        out = _seq_mean(per_seq, tokens)
    else:  # seq-mean-token-mean; an empty row's 0/0 is replaced before the mean leaves it out
        out = _seq_mean(per_seq / tokens.clamp_min(1).to(wd), tokens)
    return out.to(loss_mat.dtype)
