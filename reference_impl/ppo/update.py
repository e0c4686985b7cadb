"""The PPO update loop: replay the stored actions under the stored masks (seed 002, §4, §7, §8).

``ppo_update`` = the loop (shuffle, minibatches, KL guard, backward, gradient clip, step) around
``minibatch_loss`` (forward) and ``loss_terms`` (the formulas). The minibatch loss is a parameter:
the trainers pass the fast path of ``fast.py``, held to these formulas; mutants swap the ``step`` of
:func:`run_update` to reproduce one anti-pattern without copying the loop.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from reference_impl import _checks
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


def loss_terms_deferred(logits: torch.Tensor, values: torch.Tensor, mb: dict, *, old_log_prob: torch.Tensor,
                        clip_eps: float, vf_coef: float, ent_coef: float) -> tuple[torch.Tensor, dict]:
    """Total loss and diagnostics of one minibatch, the diagnostics left as 0-d tensors (no host sync).

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
    return loss, {k: v.detach() for k, v in metrics.items()}


def _stack(metrics: dict) -> torch.Tensor:
    """The diagnostics as one vector (one op when they are 0-d tensors of one dtype, as the
    reference's are; a step that returns Python numbers or mixed dtypes gets float64)."""
    vals = list(metrics.values())
    if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals) and len({v.dtype for v in vals}) == 1:
        return torch.stack(vals)
    device = next((v.device for v in vals if isinstance(v, torch.Tensor)), None)  # Python numbers join the tensors
    return torch.stack([torch.as_tensor(v, device=device).detach().reshape(()).to(torch.float64) for v in vals])


def as_floats(metrics: dict) -> dict:
    """0-d tensors -> Python floats in one transfer (one host sync for the whole dict)."""
    if not any(isinstance(v, torch.Tensor) for v in metrics.values()):
        return dict(metrics)
    return dict(zip(metrics, _stack(metrics).tolist()))


def loss_terms(logits: torch.Tensor, values: torch.Tensor, mb: dict, *, old_log_prob: torch.Tensor,
               clip_eps: float, vf_coef: float, ent_coef: float) -> tuple[torch.Tensor, dict]:
    """:func:`loss_terms_deferred` with the diagnostics as Python floats (one host sync).

    Implements: PPO-LOGP-1, PPO-ENT-1, PPO-RATIO-1, PPO-KL-1, PPO-KL-2, PPO-CLIPFRAC-1, PPO-LOSS-1..4.
    """
    loss, metrics = loss_terms_deferred(logits, values, mb, old_log_prob=old_log_prob, clip_eps=clip_eps,
                                        vf_coef=vf_coef, ent_coef=ent_coef)
    return loss, as_floats(metrics)


def _forward(actor: Callable, critic: Callable, mb: dict, terms: Callable, **hp) -> tuple[torch.Tensor, dict]:
    logits = actor(mb["obs"])
    values = critic(mb["critic_obs"] if "critic_obs" in mb else mb["obs"]).reshape(-1)
    return terms(logits, values, mb, old_log_prob=mb["old_log_prob"].detach(), **hp)  # PPO-OLD-1


def minibatch_loss(actor: Callable, critic: Callable, mb: dict, *, clip_eps: float, vf_coef: float,
                   ent_coef: float) -> tuple[torch.Tensor, dict]:
    """Forward the actor on the stored obs and the critic on the critic obs, with the cached old log-prob.

    Implements: PPO-OLD-1 (the cached value, detached), PPO-MAPPO-2 (critic obs of the same row).
    """
    return _forward(actor, critic, mb, loss_terms, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)


def minibatch_loss_deferred(actor: Callable, critic: Callable, mb: dict, *, clip_eps: float, vf_coef: float,
                            ent_coef: float) -> tuple[torch.Tensor, dict]:
    """:func:`minibatch_loss` with tensor diagnostics (the update loop's step: no host sync).

    Implements: PPO-OLD-1, PPO-MAPPO-2.
    """
    return _forward(actor, critic, mb, loss_terms_deferred, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)


def _check_batch(batch: dict) -> int:
    _checks.has_fields(batch, REQUIRED, "PPO-INPUT-5")
    n = batch["action"].shape[0]
    bad = {k: tuple(v.shape) for k, v in batch.items() if v.dim() == 0 or v.shape[0] != n}
    if bad:
        raise ValueError(f"[PPO-INPUT-5] every field needs {n} rows; got {bad}")
    if _checks._on():  # replay only legal (action, mask) pairs; a host sync, so a guard like the others
        _check_actions(batch["action"], batch["mask"], "PPO-MASK-3")
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
    # the KL guard reads approx_kl on the host: then one sync per minibatch (all its metrics at once);
    # without the guard the metrics stay on the device and become floats once, at the end
    now = target_kl is not None or sync_metrics is not None
    records: list[dict] = []
    pending: list[tuple[dict, torch.Tensor]] = []
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator, device=gen_device).to(device)  # a fresh shuffle per epoch
        for k, start in enumerate(range(0, n, minibatch_size)):
            idx = perm[start:start + minibatch_size]
            mb = {key: v[idx] for key, v in batch.items()}
            loss, metrics = step(actor, critic, mb, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef)
            stop = False
            if now:
                metrics = as_floats(metrics)
                if sync_metrics is not None:
                    metrics = sync_metrics(metrics)
                stop = target_kl is not None and losses.kl_early_stop(metrics["approx_kl"],
                                                                      target_kl=target_kl)  # PPO-KLSTOP-1
            if not stop:  # PPO-KLSTOP-2: the minibatch that trips the guard takes no step
                optimizer.zero_grad()
                loss.backward()
                for g in groups:
                    clip_grad_norm(g, max_norm=max_grad_norm)  # PPO-GRAD-1
                optimizer.step()
            tail = {"epoch": epoch, "minibatch": k, "early_stop": stop}
            if now:
                records.append({**metrics, **tail})
            else:
                pending.append((tail, _stack(metrics)))
                names = list(metrics)
            if stop:
                return records
    if pending:  # one transfer for the whole update
        for (tail, _), vals in zip(pending, torch.stack([v for _, v in pending]).tolist()):
            records.append({**dict(zip(names, vals)), **tail})
    return records


def ppo_update(actor, critic, optimizer, batch: dict, *, epochs: int, minibatch_size: int, clip_eps: float,
               vf_coef: float, ent_coef: float, max_grad_norm: float, target_kl: float | None,
               generator: torch.Generator | None = None,
               sync_metrics: Callable[[dict], dict] | None = None,
               minibatch_loss: Callable[..., tuple[torch.Tensor, dict]] = minibatch_loss_deferred) -> list[dict]:
    r"""PPO-Clip update on a stored rollout; one metrics dict per minibatch.

    ``batch``: obs, optional critic_obs, action [N] long, old_log_prob [N] (cached at sampling),
    mask [N,A] bool (the sampling mask), advantage [N] (normalised beforehand if wanted), return [N].
    Each minibatch replays the stored action under the stored mask, takes mean losses, clips the
    gradient norm of the actor and of the critic at ``max_grad_norm`` and steps; when approx_kl
    exceeds 2·target_kl the update stops before stepping on that minibatch. Under DDP each rank
    passes its own share and ``sync_metrics`` (see :func:`run_update`). ``minibatch_loss``: the
    forward and loss of one minibatch, with :func:`minibatch_loss`'s signature and tensor diagnostics;
    by default autograd through the plain formulas, which is the oracle of the trainers' fast path
    (``fast.minibatch_loss_fused``, closed-form gradients). Both validate their inputs while the guards are on.

    Implements: PPO-UPDATE-1, PPO-UPDATE-2, PPO-UPDATE-3, PPO-MASK-3, PPO-OLD-1, PPO-LOSS-4,
    PPO-GRAD-1, PPO-KLSTOP-2.
    """
    return run_update(actor, critic, optimizer, batch, step=minibatch_loss, epochs=epochs,
                      minibatch_size=minibatch_size, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef,
                      max_grad_norm=max_grad_norm, target_kl=target_kl, generator=generator,
                      sync_metrics=sync_metrics)
