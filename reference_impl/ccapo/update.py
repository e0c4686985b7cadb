"""The CCAPO update loop: PPO-clip + KL to π_ref on stored trajectories (seed 004, §6).

``ccapo_update`` = per epoch a fresh shuffle of the trajectories, minibatches of whole trajectories
(the objective averages per trajectory), the policy's log-probs at the stored actions, the objective
of :func:`reference_impl.ccapo.losses.policy_loss` with the KL taken against the frozen reference
policy, then zero_grad, backward, gradient-norm clip, step. Mutants swap the ``objective`` or the
``step`` through :func:`make_ccapo_update` instead of copying the loop.
"""
from __future__ import annotations

from typing import Callable

import torch

from reference_impl import _checks
from reference_impl.ccapo.losses import policy_loss

REQUIRED = ("obs", "legal", "action", "logp_old", "advantage", "mask")
METRICS = ("loss", "loss_clip", "loss_kl", "kl_ref", "approx_kl", "clip_fraction", "grad_norm")


def taken_log_prob(policy: Callable, obs: torch.Tensor, legal: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log π(a_t|s_t) [b, T] at the stored actions from ``policy(obs, legal) -> [b, T, A]`` log-probs."""
    return policy(obs, legal).gather(-1, action[..., None]).squeeze(-1)


def objective(logp_new: torch.Tensor, mb: dict, *, clip_eps: float, beta_kl: float) -> dict:
    """The §6 objective of one minibatch: ratio to the cached sampling log-probs, KL to ``mb["logp_ref"]``."""
    return policy_loss(logp_new, mb["logp_old"], mb["logp_ref"], mb["advantage"], mb["mask"], clip_eps=clip_eps,
                       beta_kl=beta_kl)  # CCAPO-PPO-1, CCAPO-PPO-2


def step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: list, max_grad_norm: float) -> torch.Tensor:
    """zero_grad, backward, clip the global L2 norm of ``params`` at ``max_grad_norm``, step; the norm before."""
    optimizer.zero_grad(set_to_none=True)  # each minibatch steps on its own gradient
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return norm


def _check(batch: dict, epochs: int, minibatch_size: int, max_grad_norm: float) -> int:
    _checks.has_fields(batch, REQUIRED, "CCAPO-UPDATE-1")
    n = batch["action"].shape[0]
    bad = {k: tuple(batch[k].shape) for k in REQUIRED if batch[k].dim() < 2 or batch[k].shape[0] != n}
    if bad:
        raise ValueError(f"[CCAPO-UPDATE-1] every field needs {n} trajectories x T steps; got {bad}")
    if epochs < 1 or minibatch_size < 1 or not max_grad_norm > 0:
        raise ValueError(f"[CCAPO-INPUT-5] epochs={epochs}, minibatch_size={minibatch_size} must be >= 1 and "
                         f"max_grad_norm={max_grad_norm} > 0")
    return n


def make_ccapo_update(objective: Callable = objective, step: Callable = step) -> Callable[..., list[dict]]:
    """A ``ccapo_update`` with the given minibatch ``objective`` and optimiser ``step`` (the reference's by default)."""

    def ccapo_update(policy, ref_policy, optimizer: torch.optim.Optimizer, batch: dict, *, clip_eps: float = 0.2,
                     beta_kl: float = 0.04, epochs: int = 4, minibatch_size: int = 64, max_grad_norm: float = 1.0,
                     generator: torch.Generator | None = None) -> list[dict]:
        r"""PPO-clip + KL epochs on a batch of B stored trajectories; one metrics dict per minibatch.

        ``policy(obs, legal)`` and ``ref_policy(obs, legal)`` give [b, T, A] log-probabilities.
        ``batch``: obs [B, T, ...], legal [B, T, A] bool, action [B, T] long, logp_old [B, T] (cached
        at sampling), advantage [B, T] (A_total), mask [B, T] bool (real steps). π_ref is evaluated
        once, under no_grad, at the stored actions. Each epoch shuffles the trajectories afresh and
        cuts them into minibatches of ``minibatch_size`` (the remainder last); each minibatch
        descends its own gradient of the negated objective

        .. math:: -\Big(\mathbb{E}_\tau\big[\tfrac1T\textstyle\sum_t
                  \min(\rho_tA_t,\mathrm{clip}(\rho_t,1\pm\epsilon)A_t)\big]
                  - \beta_{KL}\,\mathbb{E}_\tau\big[\tfrac1T\textstyle\sum_t k_3(\log\pi_{ref}-\log\pi_\theta)\big]\Big)

        with the policy's gradient norm clipped at ``max_grad_norm``. Returns float loss, loss_clip,
        loss_kl, kl_ref, approx_kl, clip_fraction, grad_norm (before clipping), int epoch, minibatch.

        Implements: CCAPO-UPDATE-1 (and calls CCAPO-PPO-1, CCAPO-PPO-2).
        """
        n = _check(batch, epochs, minibatch_size, max_grad_norm)
        params = [p for p in policy.parameters() if p.requires_grad]
        with torch.no_grad():  # π_ref is frozen: a constant of the objective (CCAPO-PPO-2)
            logp_ref = taken_log_prob(ref_policy, batch["obs"], batch["legal"], batch["action"])
        rows = {**{k: batch[k] for k in REQUIRED}, "logp_ref": logp_ref}
        gen_device = generator.device if generator is not None else "cpu"
        stats: list[torch.Tensor] = []  # per minibatch: METRICS as one device vector
        where: list[dict] = []
        for epoch in range(epochs):
            perm = torch.randperm(n, generator=generator, device=gen_device)  # a fresh shuffle (CCAPO-UPDATE-1)
            perm = perm.to(batch["action"].device)
            for k, start in enumerate(range(0, n, minibatch_size)):
                mb = {key: v[perm[start:start + minibatch_size]] for key, v in rows.items()}
                logp_new = taken_log_prob(policy, mb["obs"], mb["legal"], mb["action"])
                out = objective(logp_new, mb, clip_eps=clip_eps, beta_kl=beta_kl)  # CCAPO-PPO-1, CCAPO-PPO-2
                norm = step(optimizer, out["loss"], params, max_grad_norm)  # CCAPO-UPDATE-1
                stats.append(torch.stack([*(out[m].detach() for m in METRICS[:-1]), norm]))  # stack promotes dtypes
                where.append({"epoch": epoch, "minibatch": k})
        host = torch.stack(stats).tolist()  # one transfer per update
        return [{**dict(zip(METRICS, vals)), **w} for vals, w in zip(host, where)]

    return ccapo_update


ccapo_update = make_ccapo_update()
