"""The PPO update loop: replay the stored actions under the stored masks (seed 002, §4, §7, §8).

``ppo_update`` = the loop (shuffle, minibatches, KL guard, backward, gradient clip, step) around
``minibatch_loss`` (forward) and ``loss_terms`` (the formulas). Mutants swap the ``step`` of
:func:`run_update` to reproduce one anti-pattern without copying the loop.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from reference_impl.ppo import losses
from reference_impl.ppo.masking import _check_actions, evaluate_actions

REQUIRED = ("obs", "action", "old_log_prob", "mask", "advantage", "return")


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], *, max_norm: float) -> torch.Tensor:
    r"""Scale the gradients in place so their global L2 norm is at most ``max_norm``; return the norm before.

    .. math:: g \leftarrow g\cdot\min\Big(1, \frac{c}{\lVert g\rVert_2 + 10^{-6}}\Big)

    Implements: PPO-GRAD-1.
    """
    if not max_norm > 0:
        raise ValueError(f"[PPO-INPUT-4] max_grad_norm={max_norm!r} must be > 0")
    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)


def loss_terms(logits: torch.Tensor, values: torch.Tensor, mb: dict, *, old_log_prob: torch.Tensor,
               clip_eps: float, vf_coef: float, ent_coef: float) -> tuple[torch.Tensor, dict]:
    """Total loss and diagnostics of one minibatch from the current logits and values.

    Implements: PPO-LOGP-1, PPO-ENT-1, PPO-RATIO-1, PPO-KL-1, PPO-KL-2, PPO-CLIPFRAC-1, PPO-LOSS-1..4.
    """
    new_log_prob, entropy = evaluate_actions(logits, mb["mask"], mb["action"])  # PPO-MASK-3, PPO-LOGP-1
    r = losses.ratio(new_log_prob, old_log_prob)  # PPO-RATIO-1
    pl = losses.clipped_policy_loss(r, mb["advantage"].detach(), clip_eps=clip_eps)  # PPO-LOSS-1
    vl = losses.value_loss(values, mb["return"].detach())  # PPO-LOSS-2
    ent = entropy.mean()  # PPO-ENT-1
    loss = losses.total_loss(pl, vl, ent, vf_coef=vf_coef, ent_coef=ent_coef)  # PPO-LOSS-3
    with torch.no_grad():
        metrics = {
            "loss": loss, "policy_loss": pl, "value_loss": vl, "entropy": ent,
            "approx_kl": losses.approx_kl(old_log_prob, new_log_prob),  # PPO-KL-1
            "k3_kl": losses.k3_kl(old_log_prob, new_log_prob),  # PPO-KL-2
            "clip_fraction": losses.clip_fraction(r, clip_eps=clip_eps),  # PPO-CLIPFRAC-1
            "ratio_mean": r.mean(), "ratio_std": r.std() if r.numel() > 1 else torch.zeros_like(r.sum()),
            "log_prob_min": new_log_prob.min(),  # §7 diagnostic, PPO-SLO-5
        }
    return loss, {k: float(v.detach()) for k, v in metrics.items()}


def minibatch_loss(actor: Callable, critic: Callable, mb: dict, *, clip_eps: float, vf_coef: float,
                   ent_coef: float) -> tuple[torch.Tensor, dict]:
    """Forward the actor on the stored obs and the critic on the critic obs, with the cached old log-prob.

    Implements: PPO-OLD-1 (the cached value, detached), PPO-MAPPO-2 (critic obs of the same row).
    """
    logits = actor(mb["obs"])
    values = critic(mb["critic_obs"] if "critic_obs" in mb else mb["obs"]).reshape(-1)
    return loss_terms(logits, values, mb, old_log_prob=mb["old_log_prob"].detach(),  # PPO-OLD-1
                      clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)


def _check_batch(batch: dict) -> int:
    missing = [k for k in REQUIRED if k not in batch]
    if missing:
        raise ValueError(f"[PPO-INPUT-5] batch lacks field(s) {missing}")
    n = batch["action"].shape[0]
    bad = {k: tuple(v.shape) for k, v in batch.items() if v.dim() == 0 or v.shape[0] != n}
    if bad:
        raise ValueError(f"[PPO-INPUT-5] every field needs {n} rows; got {bad}")
    _check_actions(batch["action"], batch["mask"], "PPO-MASK-3")  # replay only legal (action, mask) pairs
    return n


def _param_groups(actor, critic) -> list[list[torch.nn.Parameter]]:
    """Actor parameters, then critic parameters not shared with the actor: each group clipped on its own."""
    a = [p for p in getattr(actor, "parameters", lambda: [])() if p.requires_grad]
    seen = {id(p) for p in a}
    c = [p for p in getattr(critic, "parameters", lambda: [])() if p.requires_grad and id(p) not in seen]
    return [g for g in (a, c) if g]


def run_update(actor, critic, optimizer, batch: dict, *, step: Callable, epochs: int, minibatch_size: int,
               clip_eps: float, vf_coef: float, ent_coef: float, max_grad_norm: float, target_kl: float | None,
               generator: torch.Generator | None = None,
               sync_metrics: Callable[[dict], dict] | None = None) -> list[dict]:
    """The loop of :func:`ppo_update` with the minibatch ``step`` as a parameter.

    ``sync_metrics`` (data-parallel runs) averages a minibatch's metrics over the ranks before the KL
    guard reads them: every rank then takes the same stop decision, on the KL of the whole
    data-parallel minibatch. The gradients themselves are averaged by DDP inside ``backward``.
    """
    n = _check_batch(batch)
    if epochs < 1 or minibatch_size < 1:
        raise ValueError(f"[PPO-INPUT-4] epochs={epochs} and minibatch_size={minibatch_size} must be >= 1")
    groups = _param_groups(actor, critic)
    device = batch["action"].device
    gen_device = generator.device if generator is not None else "cpu"
    records: list[dict] = []
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator, device=gen_device).to(device)  # a fresh shuffle per epoch
        for k, start in enumerate(range(0, n, minibatch_size)):
            idx = perm[start:start + minibatch_size]
            mb = {key: v[idx] for key, v in batch.items()}
            loss, metrics = step(actor, critic, mb, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)
            if sync_metrics is not None:
                metrics = sync_metrics(metrics)
            kl = metrics["approx_kl"]
            stop = target_kl is not None and losses.kl_early_stop(kl, target_kl=target_kl)  # PPO-KLSTOP-1
            if not stop:  # PPO-KLSTOP-2: the minibatch that trips the guard takes no step
                optimizer.zero_grad()
                loss.backward()
                for g in groups:
                    clip_grad_norm(g, max_norm=max_grad_norm)  # PPO-GRAD-1
                optimizer.step()
            records.append({**metrics, "epoch": epoch, "minibatch": k, "early_stop": stop})
            if stop:
                return records
    return records


def ppo_update(actor, critic, optimizer, batch: dict, *, epochs: int, minibatch_size: int, clip_eps: float,
               vf_coef: float, ent_coef: float, max_grad_norm: float, target_kl: float | None,
               generator: torch.Generator | None = None,
               sync_metrics: Callable[[dict], dict] | None = None) -> list[dict]:
    r"""PPO-Clip update on a stored rollout; one metrics dict per minibatch.

    ``batch``: obs, optional critic_obs, action [N] long, old_log_prob [N] (cached at sampling),
    mask [N,A] bool (the sampling mask), advantage [N] (normalised beforehand if wanted), return [N].
    Each minibatch replays the stored action under the stored mask, takes mean losses, clips the
    gradient norm of the actor and of the critic at ``max_grad_norm`` and steps; when approx_kl
    exceeds 2·target_kl the update stops before stepping on that minibatch. Under DDP each rank
    passes its own share and ``sync_metrics`` (see :func:`run_update`).

    Implements: PPO-UPDATE-1, PPO-UPDATE-2, PPO-UPDATE-3, PPO-MASK-3, PPO-OLD-1, PPO-LOSS-4,
    PPO-GRAD-1, PPO-KLSTOP-2.
    """
    return run_update(actor, critic, optimizer, batch, step=minibatch_loss, epochs=epochs,
                      minibatch_size=minibatch_size, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef,
                      max_grad_norm=max_grad_norm, target_kl=target_kl, generator=generator,
                      sync_metrics=sync_metrics)
