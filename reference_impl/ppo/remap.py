"""Sampling on the compacted legal set and rebuilding the same local distribution (seed 002, §5).

Some implementations compress the legal ids to 0..K-1 and sample there. The buffer must then keep
``valid_ids`` and ``local_idx``, and the update must take the log-prob of ``local_idx`` under the
rebuilt local distribution: never of the global id, never of a clamped index.
"""
from __future__ import annotations

import torch
from torch.distributions import Categorical

from reference_impl import _checks


def local_sample(logits_row: torch.Tensor, mask_row: torch.Tensor, *, generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Sample on the legal ids of one row.

    .. math:: v = \{i : m_i\},\ k \sim \mathrm{softmax}(z_v),\ a = v_k,\ \ell_{\text{old}} = \mathrm{sg}[\log \mathrm{softmax}(z_v)_k]

    Returns ``(valid_ids [K] long, local_idx [] long, action_id [] long, old_log_prob [] detached)``.

    Implements: PPO-REMAP-1.
    """
    if logits_row.dim() != 1:
        raise ValueError(f"[PPO-INPUT-2] local_sample takes one row ([A]), got shape {tuple(logits_row.shape)}")
    _checks.bool_mask(mask_row, "PPO-INPUT-2", "mask_row")
    _checks.same_shape("PPO-INPUT-2", logits_row=logits_row, mask_row=mask_row)
    _checks.finite(logits_row, "PPO-INPUT-1", "logits_row")
    _checks.rows_nonempty(mask_row, "PPO-INPUT-2", "mask_row")
    valid_ids = torch.nonzero(mask_row, as_tuple=False).squeeze(-1)  # original action ids
    dist = Categorical(logits=logits_row[valid_ids], validate_args=False)
    probs = dist.probs.detach().float()
    local_idx = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return valid_ids, local_idx, valid_ids[local_idx], dist.log_prob(local_idx).detach()


def local_log_prob(logits_row: torch.Tensor, valid_ids: torch.Tensor, local_idx: torch.Tensor) -> torch.Tensor:
    r"""Rebuild the local distribution on the stored ``valid_ids`` and score the stored ``local_idx``.

    .. math:: \ell = \log \mathrm{softmax}(z_{v})_{k} = \log \pi_{\text{masked}}(v_k)

    A ``local_idx`` outside [0, K) raises IndexError: no ``min(idx, K-1)`` fallback.

    Implements: PPO-REMAP-1, PPO-REMAP-2.
    """
    if logits_row.dim() != 1:
        raise ValueError(f"[PPO-INPUT-2] local_log_prob takes one row ([A]), got shape {tuple(logits_row.shape)}")
    _checks.finite(logits_row, "PPO-INPUT-1", "logits_row")
    if valid_ids.numel() == 0:
        raise ValueError("[PPO-INPUT-2] valid_ids is empty: a row needs at least one legal action")
    _checks.index_in_range(valid_ids, logits_row.shape[-1], "PPO-INPUT-3", "valid_ids")
    if bool((local_idx < 0).any()) or bool((local_idx >= valid_ids.numel()).any()):
        raise IndexError(f"[PPO-REMAP-2] local_idx {local_idx.tolist()} outside [0, {valid_ids.numel()}): "
                         "an out-of-range index is an error, never clamped to the last action")
    dist = Categorical(logits=logits_row[valid_ids], validate_args=False)
    return dist.log_prob(local_idx.long())
