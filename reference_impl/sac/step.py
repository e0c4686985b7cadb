"""One SAC V2 update in the order of the §8 loop, as four phases (seed 000, §6, §8, §9).

``update_step`` runs the phases in :data:`ORDER`: critic (target under no_grad, then one clipped
step), policy (against the just-updated critics, plus BC), temperature (entropy of the policy as it
was before its step) and the soft target update last. Mutants reorder :data:`ORDER` through
:func:`run_phases` instead of copying the loop. The trainer (``reference_impl.sac.trainer``) calls
``update_step`` itself, so the loop the suite checks is the loop that trains.

Diagnostics stay tensors while the phases run and become Python floats once, at the end (one
stacked tensor, one ``.tolist()``: a single device sync per update).
"""
from __future__ import annotations

import copy
import functools
from typing import Callable, Sequence

import torch

from reference_impl import _checks
from reference_impl.sac.backup import td_target, top_p_select, top_p_soft_value
from reference_impl.sac.fast import (
    critic_heads_fused,
    policy_head_fused,
    top_p_backup_fused,
)
from reference_impl.sac.losses import (
    bc_loss,
    clamp_log_alpha,
    critic_loss,
    critic_loss_total,
    policy_loss_total,
    temperature_loss,
)
from reference_impl.sac.masking import PROB_EPS, entropy, masked_softmax, target_entropy
from reference_impl.sac.updates import soft_update_

ORDER = ("critic", "policy", "temperature", "target")  # SAC-STEP-1
BATCH_KEYS = ("obs", "action", "reward", "next_obs", "done", "is_demo", "legal_mask", "next_legal_mask")


def init_target(critic: torch.nn.Module) -> torch.nn.Module:
    r""":math:`\bar\phi_i \leftarrow \phi_i`: a frozen deep copy of the online critics (equal values, separate
    storage).

    Implements: SAC-TARGET-2.
    """
    target = copy.deepcopy(critic)
    return target.requires_grad_(False)


def _clipped_step(opt: torch.optim.Optimizer, loss: torch.Tensor, params, max_norm: float) -> torch.Tensor:
    """zero_grad, backward, clip the global L2 norm of ``params`` at ``max_norm``, step; the norm before."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)  # SAC-GRAD-1
    opt.step()
    return norm


def _taken(q_all: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return q_all.gather(1, action[:, None]).squeeze(1)


# Each phase is an objective (a pure function of the networks and the batch: the losses and their
# diagnostics, no side effect, so the accelerator plan traces as one graph, test_sac_graph.py) and a
# step that applies it. A captured update (reference_impl.sac.graphed) replays the same phases.

_COMPILED: dict[Callable, Callable] = {}


def _head(fn: Callable, hp: dict) -> Callable:
    """The fused head ``fn``, or with ``hp["compile"]`` its torch.compile'd twin (Inductor, one graph: a graph
    break is an error), which fuses its elementwise passes over [B, |A|] into a few kernels, forward and
    backward. Only the heads: the networks stay eager (a GRU is cuDNN's, and TorchDynamo would not trace
    it). The guards read values on the host, so a validated call takes ``fn`` itself."""
    if not hp["compile"] or _checks._on():
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, fullgraph=True, dynamic=False)
    return _COMPILED[fn]


def critic_objective(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict]:
    """The critic loss (SAC-CRITIC-2 on the SAC-TD-1 target) and its diagnostics, by the plain formulas
    or, with ``hp["fast"]``, through the fused heads."""
    return (_critic_objective_fused if hp["fast"] else _critic_objective_plain)(s, b, hp)


def _critic_objective_plain(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict]:
    alpha = s["log_alpha"].detach().exp()
    with torch.no_grad():
        pi_next = masked_softmax(s["policy"](b["next_obs"]), b["next_legal_mask"])  # SAC-MASK-1/2
        q1_t, q2_t = s["target"](b["next_obs"])
        v_next = top_p_soft_value(pi_next, q1_t, q2_t, b["next_legal_mask"], alpha=alpha, p=hp["top_p"])  # SAC-TOPP-3
        y = td_target(b["reward"], b["done"], v_next, gamma=hp["gamma"])  # SAC-TD-1
        k = hp["kpi_rows"]  # the coverage monitor may read a slice of the batch: a diagnostic, not the backup
        sel = top_p_select(pi_next[:k], b["next_legal_mask"][:k], p=hp["top_p"])  # SAC-TOPP-1
        coverage = (pi_next[:k] * sel).sum(-1).mean()  # SAC-TOPP-4 monitor
    q1_all, q2_all = s["critic"](b["obs"])
    loss = critic_loss_total(q1_all, q2_all, b["action"], y, legal_mask=b["legal_mask"], delta=hp["huber_delta"],
                             lam_cql=hp["lambda_cql"], use_cql=hp["use_cql"])  # SAC-CRITIC-2
    with torch.no_grad():  # the TD (Huber) share of the total, logged apart from the CQL share
        q1, q2 = _taken(q1_all, b["action"]), _taken(q2_all, b["action"])
        td_part = critic_loss(q1, q2, y, delta=hp["huber_delta"])  # SAC-CRITIC-1
    return loss, dict(critic_loss=td_part, cql_loss=loss.detach() - td_part, target_mean=y.mean(),
                      q_mean=torch.minimum(q1, q2).mean(), top_p_coverage=coverage,
                      demo_share=b["is_demo"].to(y.dtype).mean())


def _critic_objective_fused(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict]:
    """The critic objective through the fused heads: the same formulas (its plain twin above is the
    oracle, conformance_tests/meta/test_sac_fastpaths.py), with no [B, |A|] temporaries besides the network outputs."""
    alpha = s["log_alpha"].detach().exp()
    backup, heads = _head(top_p_backup_fused, hp), _head(critic_heads_fused, hp)
    with torch.no_grad():
        q1_t, q2_t = s["target"](b["next_obs"])
        v_next, cov = backup(s["policy"](b["next_obs"]), q1_t, q2_t, b["next_legal_mask"], alpha=alpha,
                             p=hp["top_p"], eps=PROB_EPS)  # SAC-MASK-1/2, SAC-TOPP-1..4
        del q1_t, q2_t
        y = td_target(b["reward"], b["done"], v_next, gamma=hp["gamma"])  # SAC-TD-1
    q1_all, q2_all = s["critic"](b["obs"])
    loss, huber, cql, q_min = heads(q1_all, q2_all, b["action"], y, legal_mask=b["legal_mask"], delta=hp["huber_delta"],
                                    lam_cql=hp["lambda_cql"], use_cql=hp["use_cql"])  # SAC-CRITIC-2, both critics
    return loss, dict(critic_loss=huber, cql_loss=cql, target_mean=y.mean(), q_mean=q_min.mean(),
                         top_p_coverage=(cov if hp["kpi_rows"] is None else cov[:hp["kpi_rows"]]).mean(),
                         demo_share=b["is_demo"].sum() / y.shape[0])


def _critic_phase(s: dict, b: dict, hp: dict) -> None:
    loss, out = critic_objective(s, b, hp)
    norm = _clipped_step(s["opt_q"], loss, s["critic"].parameters(), hp["grad_clip"])
    s["out"].update(critic_grad_norm=norm, **out)


def policy_objective(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """The policy loss (SAC-POL-3, with BC), its diagnostics, and the entropy of the policy before its
    step (SAC-ENT-2, for the temperature phase); option A through the fused head with ``hp["fast"]``."""
    fused = hp["fast"] and not hp["policy_use_topp"]
    return (_policy_objective_fused if fused else _policy_objective_plain)(s, b, hp)


def _policy_objective_plain(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict, torch.Tensor]:
    alpha = s["log_alpha"].detach().exp()
    pi = masked_softmax(s["policy"](b["obs"]), b["legal_mask"])  # SAC-MASK-1/2
    with torch.no_grad():
        q1, q2 = s["critic"](b["obs"])  # the critics as they are now (after the critic phase)
    p = hp["top_p"] if hp["policy_use_topp"] else None
    loss = policy_loss_total(pi, q1, q2, b["legal_mask"], b["action"], b["is_demo"], alpha=alpha,
                             lam_bc=hp["lambda_bc"], p=p)  # SAC-POL-3
    with torch.no_grad():  # the BC share of the total, logged apart from L_π
        pi0 = pi.detach()
        bc_part = bc_loss(torch.log(pi0), b["action"], b["is_demo"], lam=hp["lambda_bc"])  # SAC-BC-1
        ent = entropy(pi0, b["legal_mask"])  # SAC-ENT-2
    return loss, dict(policy_loss=loss.detach() - bc_part, bc_loss=bc_part), ent


def _policy_objective_fused(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """Option A policy objective through the fused head (oracle: the plain twin above)."""
    logits = s["policy"](b["obs"])
    with torch.no_grad():
        q1, q2 = s["critic"](b["obs"])  # the critics as they are now (after the critic phase)
    head = _head(policy_head_fused, hp)
    loss, pol, bc, ent = head(logits, q1, q2, b["legal_mask"], b["action"], b["is_demo"],
                              alpha=s["log_alpha"].detach().exp(), lam_bc=hp["lambda_bc"])  # SAC-POL-3
    return loss, dict(policy_loss=pol, bc_loss=bc), ent


def _policy_phase(s: dict, b: dict, hp: dict) -> None:
    loss, out, ent = policy_objective(s, b, hp)
    s["entropy_before_step"] = ent  # SAC-ENT-2 of the pre-step policy, for the temperature phase
    norm = _clipped_step(s["opt_pi"], loss, s["policy"].parameters(), hp["grad_clip"])
    s["out"].update(policy_grad_norm=norm, **out)


def temperature_objective(s: dict, b: dict, hp: dict) -> tuple[torch.Tensor, dict]:
    """The temperature loss (SAC-TEMP-2) on the entropy of the policy before its step (SAC-ENT-2; a
    reordered, mutant loop that reaches here first measures the policy as it is)."""
    H = s.get("entropy_before_step")
    if H is None:
        with torch.no_grad():
            H = entropy(masked_softmax(s["policy"](b["obs"]), b["legal_mask"]), b["legal_mask"])  # SAC-ENT-2
    rows = hp["all_rows"] or (lambda x: x)  # DDP: every rank's rows, so log α moves the same on every rank
    H = rows(H)
    H_tgt = rows(target_entropy(b["legal_mask"], kappa=hp["kappa"], dtype=H.dtype))  # SAC-ENT-1
    loss = temperature_loss(s["log_alpha"], H, H_tgt)  # SAC-TEMP-2
    return loss, dict(alpha_loss=loss.detach(), entropy=H.mean(), target_entropy=H_tgt.mean())


def _temperature_phase(s: dict, b: dict, hp: dict) -> None:
    loss, out = temperature_objective(s, b, hp)
    s["opt_alpha"].zero_grad(set_to_none=True)
    loss.backward()
    s["opt_alpha"].step()
    with torch.no_grad():
        s["log_alpha"].copy_(clamp_log_alpha(s["log_alpha"], alpha_min=hp["alpha_min"], alpha_max=hp["alpha_max"]))  # SAC-TEMP-3
    s["out"].update(**out, alpha=s["log_alpha"].detach().exp())


def _target_phase(s: dict, b: dict, hp: dict) -> None:
    soft_update_(list(s["target"].parameters()), list(s["critic"].parameters()), tau=hp["tau"])  # SAC-TARGET-1


def stack_diagnostics(out: dict) -> torch.Tensor:
    """The 0-d diagnostic tensors of ``out`` as one vector in their widest dtype (one transfer reads them)."""
    vals = [v if v.dim() == 0 else v.reshape(()) for v in out.values()]  # a one-element log α may be [1]
    dtypes = {v.dtype for v in vals}
    dt = dtypes.pop() if len(dtypes) == 1 else functools.reduce(torch.promote_types, dtypes)
    with torch.no_grad():  # only the values of another dtype are converted
        return torch.stack([v if v.dtype == dt else v.to(dt) for v in vals])


def _floats(out: dict) -> dict:
    """0-d diagnostic tensors -> Python floats in one transfer."""
    return dict(zip(out, stack_diagnostics(out).tolist())) if out else {}


PHASES: dict[str, Callable[[dict, dict, dict], None]] = {
    "critic": _critic_phase, "policy": _policy_phase, "temperature": _temperature_phase, "target": _target_phase,
}


def phase_diagnostics(order: Sequence[str], policy, critic, target, log_alpha, optimizers: dict, batch: dict,
                      **hp) -> dict[str, torch.Tensor]:
    """The phases of :func:`update_step` in the given order; returns the diagnostics as 0-d tensors
    (no host read: a captured update records exactly this)."""
    _checks.has_fields(batch, BATCH_KEYS, "SAC-STEP-1")
    s = {"policy": policy, "critic": critic, "target": target, "log_alpha": log_alpha,
         "opt_q": optimizers["q"], "opt_pi": optimizers["pi"], "opt_alpha": optimizers["alpha"], "out": {}}
    for name in order:
        PHASES[name](s, batch, hp)
    return s["out"]


def run_phases(order: Sequence[str], *args, **hp) -> dict:
    """The phases of :func:`update_step` in the given order; returns the diagnostics as floats."""
    return _floats(phase_diagnostics(order, *args, **hp))


def step_hp(*, gamma: float = 0.995, top_p: float = 0.98, kappa: float = 0.9, tau: float = 0.005,
            lambda_bc: float = 0.1, lambda_cql: float = 0.5, use_cql: bool = True, policy_use_topp: bool = False,
            huber_delta: float = 1.0, grad_clip: float = 0.5, alpha_min: float = 1e-4, alpha_max: float = 2.0,
            kpi_rows: int | None = None, all_rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
            fast: bool = True, compile: bool = False) -> dict:
    """The hyperparameters of :func:`update_step`, defaults (seed 000 V2) filled in."""
    return dict(locals())


def make_update_step(order: Sequence[str] = ORDER) -> Callable[..., dict]:
    """An ``update_step`` running the phases in ``order`` (the reference uses :data:`ORDER`)."""

    def update_step(policy, critic, target, log_alpha, optimizers: dict, batch: dict, **hp) -> dict:
        r"""One V2 update: critic step, policy step against the updated critics, temperature step on the
        entropy of the pre-step policy, soft target update; each network step clips its gradient norm.

        ``policy`` and ``critic`` may be DDP wrappers (their gradients are then averaged over ranks).
        The temperature rule is SAC-TEMP-2 on ``optimizers["alpha"]``: with SGD at rate η_α its step
        is exactly SAC-TEMP-1's. ``all_rows`` maps a per-row tensor to the rows of every rank
        (``distributed.gather_cat``) before the temperature step; the identity by default.
        ``kpi_rows`` limits the Top-p coverage monitor to the first rows (None: all). ``fast`` runs the
        critic phase and the option-A policy phase through the fused heads (``critic_head_fused``,
        ``policy_head_fused``, ``top_p_backup_fused``); ``fast=False`` runs the plain formulas,
        which are the fused ones' oracle. ``compile`` runs the fused heads torch.compile'd once the guards
        are off (a GPU's opt-in: the trainer's ``--set compile=True``; the same values to rounding).

        Keyword arguments: those of :func:`step_hp`. Returns floats: critic_loss (Huber share), cql_loss,
        policy_loss (L_π share), bc_loss, alpha_loss, critic/policy_grad_norm (before clipping),
        target_mean, q_mean (min of the twin Q at the taken actions), top_p_coverage, demo_share,
        entropy, target_entropy, alpha (after the step and the clamp).

        Implements: SAC-STEP-1, SAC-GRAD-1 (and calls SAC-CRITIC-2, SAC-POL-3, SAC-TEMP-2/3, SAC-TARGET-1).
        """
        return run_phases(order, policy, critic, target, log_alpha, optimizers, batch, **step_hp(**hp))

    return update_step


update_step = make_update_step()
