"""Masking on logits, sampling with a cached detached log-prob, and replay (seed 002, §3, §4).

One function builds the masked distribution; sampling and update both go through it, so the same
mask and the same action give the same distribution on both sides.
"""
from __future__ import annotations

import torch
from torch.distributions import Categorical

from reference_impl import _checks

MASK_FILL = -1e9  # PPO-MASK-1: the document's finite stand-in for -inf


def fill_value(dtype: torch.dtype) -> float:
    """-1e9, or the dtype's most negative finite value where -1e9 does not fit (float16)."""
    return max(MASK_FILL, torch.finfo(dtype).min)


def _check_logits_and_mask(logits: torch.Tensor, mask: torch.Tensor) -> None:
    _checks.bool_mask(mask, "PPO-INPUT-2", "mask")
    _checks.same_shape("PPO-INPUT-2", logits=logits, mask=mask)
    _checks.finite(logits, "PPO-INPUT-1", "logits")
    _checks.rows_nonempty(mask, "PPO-INPUT-2", "mask")


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""Illegal logits replaced by a large negative constant; legal logits unchanged.

    .. math:: \tilde z_i = z_i\ \text{if}\ m_i\ \text{else}\ \max(-10^{9}, \mathrm{finfo.min})

    Implements: PPO-MASK-1, PPO-MASK-4 (bad input: PPO-INPUT-1, PPO-INPUT-2).
    """
    _check_logits_and_mask(logits, mask)
    return logits.masked_fill(~mask, fill_value(logits.dtype))


def masked_distribution(logits: torch.Tensor, mask: torch.Tensor) -> Categorical:
    r"""The categorical distribution over the masked logits, :math:`\pi = \mathrm{softmax}(\tilde z)`.

    The masked logits are shifted by their row maximum first: softmax does not change, but the
    normalised log-probs then lose at most an ulp of log|A| instead of an ulp of the largest logit,
    which in float16 at logits near 128 is already 0.125 nats.

    Implements: PPO-MASK-1, PPO-MASK-4.
    """
    z = masked_logits(logits, mask)
    z = z - z.max(dim=-1, keepdim=True).values.detach()  # PPO-MASK-4: shift before normalising
    return Categorical(logits=z, validate_args=False)


def _check_actions(action: torch.Tensor, mask: torch.Tensor, clause: str) -> None:
    """Every action indexes a column of ``mask`` and is legal there."""
    if action.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"[PPO-INPUT-3] action must be an integer tensor, got {action.dtype}")
    if tuple(action.shape) != tuple(mask.shape[:-1]):
        raise ValueError(f"[PPO-INPUT-3] action shape {tuple(action.shape)} does not match mask {tuple(mask.shape)}")
    _checks.index_in_range(action, mask.shape[-1], "PPO-INPUT-3", "action")
    legal = mask.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    if not bool(legal.all()):
        raise RuntimeError(f"[{clause}] action illegal under its mask at rows {torch.nonzero(~legal).flatten().tolist()[:8]}")


def sample_actions(logits: torch.Tensor, mask: torch.Tensor, *, generator: torch.Generator | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Sample one action per row from the masked policy and cache its log-prob, detached.

    .. math:: a \sim \pi_{\text{old}}(\cdot|s),\quad \ell_{\text{old}} = \mathrm{sg}[\log\pi_{\text{old}}(a|s)]

    Raises if a sampled action is illegal under its mask (the document's assertion).

    Implements: PPO-MASK-2, PPO-OLD-1.
    """
    dist = masked_distribution(logits, mask)
    probs = dist.probs.detach()
    if probs.dtype in (torch.float16, torch.bfloat16):
        probs = probs.float()  # multinomial wants full precision; the distribution is unchanged
    flat = probs.reshape(-1, probs.shape[-1])
    action = torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
    _check_actions(action, mask, "PPO-MASK-2")
    return action, dist.log_prob(action).detach()  # PPO-OLD-1: cached, no gradient


def evaluate_actions(logits: torch.Tensor, mask: torch.Tensor, action: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Replay a stored action under its stored mask: (new log-prob, per-row entropy).

    .. math:: \ell_{\text{new}} = \log\pi_\theta(a|s) = \tilde z_a - \log\sum_j e^{\tilde z_j},\quad
              H = -\sum_{j\in\mathcal A(s)} \pi_j \log \pi_j

    Both come from one distribution object built on the same mask; an action illegal under the
    stored mask raises.

    Implements: PPO-MASK-3, PPO-LOGP-1, PPO-ENT-1.
    """
    dist = masked_distribution(logits, mask)  # validates logits and mask first
    _check_actions(action, mask, "PPO-MASK-3")
    return dist.log_prob(action.long()), dist.entropy()
