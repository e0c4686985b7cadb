"""Reward terms: n-gram coverage, InfoNCE, the lexical bigram bonus, step reward, shaping (seed 000, §5, §14)."""
from __future__ import annotations

from typing import Collection

import torch

from reference_impl import _checks


def ngram_coverage(agent_text: str, ref_text: str, *, n: int = 3, window: int = 64) -> float:
    r""":math:`\mathrm{cov}_t = (1/|S_t|) \sum_{x \in S_t} \mathbf{1}[x \in G_t]`: the share of the agent's
    n-grams (last W characters, counted with multiplicity) found among the reference window's n-grams.
    No n-gram yet gives 0.

    Implements: SAC-COV-1.
    """
    if n < 1 or window < n:
        raise ValueError(f"[SAC-COV-1] need 1 <= n <= window, got n={n}, window={window}")
    a, r = agent_text[-window:], ref_text[-window:]
    agent = [a[i : i + n] for i in range(len(a) - n + 1)]
    if not agent:
        return 0.0
    ref = {r[i : i + n] for i in range(len(r) - n + 1)}
    return sum(g in ref for g in agent) / len(agent)


def info_nce(query, positive, negatives, *, tau: float = 0.07) -> torch.Tensor:
    r""":math:`\mathrm{nce} = \log e^{z(x^+)} / (e^{z(x^+)} + \sum_{x^-} e^{z(x^-)})`, per row, with
    :math:`z(x) = \langle q, \bar f(x)\rangle/\tau`.

    ``query`` [B,d] comes from the online encoder; ``positive`` [B,d] and ``negatives`` [B,K,d] or
    a shared queue [K,d] come from the EMA target encoder and receive no gradient.

    Implements: SAC-NCE-1, SAC-NCE-2.
    """
    _checks.in_range(tau, 0.0, float("inf"), "SAC-NCE-1", "tau")
    pos = positive.detach()
    neg = negatives.detach()
    if neg.dim() == 2:
        neg = neg.unsqueeze(0).expand(query.shape[0], -1, -1)
    s_pos = (query * pos).sum(-1, keepdim=True) / tau
    s_neg = torch.einsum("bd,bkd->bk", query, neg) / tau
    logits = torch.cat([s_pos, s_neg], dim=-1)
    return s_pos.squeeze(-1) - torch.logsumexp(logits, dim=-1)


def bigram_bonus(prev_char: str, char: str, lexicon: Collection[str], *, lam: float = 1.0) -> float:
    r"""bonus_t = λ_bigram · 1[b_t ∈ L] with b_t the previous target character followed by the action.

    Implements: SAC-BIGRAM-1.
    """
    return lam if (prev_char + char) in lexicon else 0.0


def step_reward(cov_norm, nce_norm, garble, illegal, *, lam_cov: float = 1.0, lam_nce: float = 0.5,
                lam_gar: float = 0.1, lam_ill: float = 2.0, illegal_done: bool = False):
    r"""r_t = λ_cov N(cov_t) + λ_nce N(nce_t) − λ_gar garble_t − λ_ill ill_t.

    With ``illegal_done`` an illegal step ends the episode and its reward is exactly −λ_ill.
    Returns ``(reward, done)``.

    Implements: SAC-REWARD-1, SAC-REWARD-2.
    """
    _checks.same_shape("SAC-REWARD-1", cov_norm=cov_norm, nce_norm=nce_norm, garble=garble, illegal=illegal)
    ill = illegal.to(cov_norm.dtype)
    r = lam_cov * cov_norm + lam_nce * nce_norm - lam_gar * garble.to(cov_norm.dtype) - lam_ill * ill
    if not illegal_done:
        return r, torch.zeros_like(illegal, dtype=torch.bool)
    hard = illegal.bool()
    return torch.where(hard, torch.full_like(r, -lam_ill), r), hard  # SAC-REWARD-2


def shaped_reward(reward, phi_s, phi_next, done, *, gamma: float) -> torch.Tensor:
    r""":math:`r' = r + \gamma\,\Phi(s_{t+1}) - \Phi(s_t)`, with Φ of a terminal state taken as 0.

    Implements: SAC-SHAPE-1.
    """
    _checks.in_range(gamma, 0.0, 1.0, "SAC-INPUT-4", "gamma", hi_open=True)
    return reward + gamma * (1.0 - done.to(reward.dtype)) * phi_next - phi_s


# ---------------------------------------------------------------------------------------------- batched forms
# The environment computes the two text terms above for all of its rows at once, on ids, on the training
# device. Same values as the string forms (the environment's differential check holds them to those).
NO_CHAR = -1  # an empty slot before a text shorter than its window


def ngram_coverage_windows(agent: torch.Tensor, ref: torch.Tensor, *, n: int = 3) -> torch.Tensor:
    r"""cov_t of :func:`ngram_coverage` for every row: ``agent`` and ``ref`` [B, W] hold the last W characters
    of each row's two texts as ids (equal ids for equal characters), right-aligned after :data:`NO_CHAR`
    slots where a text is shorter than W. Equals ``ngram_coverage(agent_text, ref_text, n=n, window=W)``
    per row, in the default float dtype.

    Implements: SAC-COV-1.
    """
    if n < 1 or agent.shape[-1] < n:
        raise ValueError(f"[SAC-COV-1] need 1 <= n <= window, got n={n}, window={agent.shape[-1]}")
    P = agent.shape[-1] - n + 1  # n-grams per window; right-aligned, one is whole iff its first slot is
    eq = (agent[..., :, None] == ref[..., None, :]) & (ref != NO_CHAR)[..., None, :]  # [B, W, W] character matches
    same = eq[..., :P, :P].clone()  # same[b, i, j]: agent n-gram i equals reference n-gram j, slot by slot
    for k in range(1, n):
        same &= eq[..., k:k + P, k:k + P]
    a_whole = agent[..., :P] != NO_CHAR
    hits, count = (same.any(-1) & a_whole).sum(-1), a_whole.sum(-1)  # x ∈ G_t, with multiplicity over S_t
    return torch.where(count > 0, hits / count.clamp_min(1), 0.0)  # no n-gram yet: 0


def bigram_bonus_ids(prev: torch.Tensor, char: torch.Tensor, pairs: torch.Tensor, vocab: int, *,
                     lam: float = 1.0) -> torch.Tensor:
    r""":func:`bigram_bonus` for every row, on ids: λ_bigram · 1[prev·V + char ∈ ``pairs``], with ``pairs`` the
    sorted keys p·V + c of the id pairs whose characters form a word of L (V = ``vocab``).

    Implements: SAC-BIGRAM-1.
    """
    key = prev * vocab + char
    if pairs.numel() == 0:
        return torch.zeros(key.shape, device=key.device)
    at = torch.searchsorted(pairs, key).clamp_max(pairs.numel() - 1)
    return (pairs[at] == key) * lam
