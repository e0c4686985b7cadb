"""Contract of the ``ccapo`` family (seed 004, CCAPO v4.1).

Shapes: N trajectories of one prompt (a group), B trajectories in a batch, T steps. Counts may be
integer or float tensors; scores and advantages are float tensors (float64 unless the inputs are
another float dtype: floating results keep the inputs' floating dtype, CCAPO-DTYPE-1).
Hyper-parameters are keyword-only. Bad input raises an exception whose message names the clause
(``CCAPO-INPUT-*``).

STDB state is plain data, so a third party can build it from any store::

    stats = {
        "edges":   {(loc, prev_fp, fp): {"n_total": int, "n_succ": int, "d_sum": float}},
        "anchors": {(loc, prev_fp): {"v_bar": float, "n_updates": int}},
        "n_succ_total": int,      # successful trajectories seen
        "n_total_global": int,    # trajectories seen
    }
    trajectory = {"anchors": [(loc, prev_fp), ...], "fingerprints": [fp, ...], "success": bool}

An edge is keyed by its contextual anchor (Abstract_Loc(sₜ), Fingerprint(aₜ₋₁)) and the
fingerprint of a_t; ``d_sum`` summed over successful trajectories gives d_goal = d_sum / n_succ.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

import torch
from torch import Tensor

from conformance_tests.contract import Output


class CcapoOps(Protocol):
    # ---------------------------------------------------------------- §3.1 nodes, §5.2.1 anchors
    def fingerprint(self, raw_action: str, *, domain: str, labels: Mapping[str, str] | None = None) -> str:
        """Raw action text -> abstract fingerprint ``VERB(arg, ...)`` with instance numbers,
        coordinates and element ids dropped. ``domain`` picks a registered fingerprinter
        ("alfworld", "gui"); the GUI one resolves an element id through ``labels`` (id -> label).
        An unknown domain, a GUI action without an element id or with one missing from ``labels`` raises
        (CCAPO-INPUT-4)."""

    def abstract_location(self, raw_location: str, *, domain: str) -> str:
        """Coarse location of a state: the room (alfworld), the activity name (android), or
        host + URL path without scheme, query and fragment (web; a trailing slash may be kept or
        stripped, the case of the path is kept)."""

    def anchor(self, location: str, prev_fingerprint: str | None) -> tuple[str, str]:
        """(Abstract_Loc(sₜ), Fingerprint(aₜ₋₁)); at t = 0 (``None``) the previous action is
        the sentinel ``"<START>"``."""

    # ---------------------------------------------------------------- §3.2 edge scoring
    def importance(self, n_succ: Tensor, n_total: Tensor, *, alpha_smooth: float = 1.0) -> Tensor:
        """Broadcastable counts -> I(E) = (N_succ + α)/(N_total + 2α) (Beta(α, α) smoothing)."""

    def criticality(self, n_succ: Tensor, n_total: Tensor, n_succ_total: Tensor | float,
                    n_total_global: Tensor | float, *, eps: float = 1e-8) -> Tensor:
        """C(E) = [N_succ/(N_total+ε)] / [N_succ_total/(N_total_global+ε) + ε]."""

    def distance_decay(self, d_goal: Tensor, *, distance_exponent: float = 0.5) -> Tensor:
        """D(E) = (d_goal + 1)^(-distance_exponent), d_goal >= 0."""

    def q_stdb(self, importance: Tensor, criticality: Tensor, distance: Tensor, *, lam: float = 1.0) -> Tensor:
        """Q = σ(log(I·(1+λC)·D)) = x/(1+x) with x = I(1+λC)D; in (0, 1) for I, D > 0."""

    def score_steps(self, stats: Mapping[str, Any], anchors: Sequence[tuple[str, str]],
                    fingerprints: Sequence[str], *, alpha_smooth: float = 1.0, distance_exponent: float = 0.5,
                    lam: float = 1.0, eps: float = 1e-8) -> dict[str, Tensor]:
        """Look the T steps of a trajectory up in the STDB state -> {"q": [T] float64 (0 where the
        edge is missing), "edge_seen": [T] bool, "v_bar": [T] float64 (0 where unseen),
        "anchor_seen": [T] bool (the anchor has a V̄)}. d_goal of an edge never on a successful
        trajectory is unknown and gets no decay (D = 1)."""

    # ---------------------------------------------------------------- §4 rewards
    def macro_return(self, success: Tensor, n_steps: Tensor, *, r_terminal: float = 10.0,
                     r_penalty: float = -0.1) -> Tensor:
        """[N] bool, [N] int -> [N] float64: 1[success]·R_terminal + N_step·R_penalty."""

    def loop_mask(self, fingerprint_ids: Tensor) -> Tensor:
        """[..., T] long (one id per fingerprint) -> [..., T] bool: step t closes a loop when its
        fingerprint equals that of step t-1 (A→A) or t-2 (A→B→A)."""

    def micro_reward(self, q: Tensor, edge_seen: Tensor, is_loop: Tensor) -> Tensor:
        """[T] each -> [T]: R_micro = Q_STDB(edge), 0 where the edge is missing or the step is a loop."""

    # ---------------------------------------------------------------- §5 advantages
    def macro_advantage(self, returns: Tensor, *, eps: float = 1e-8) -> Tensor:
        """[..., N] -> [..., N]: z-score within the group (last dim), population std (ddof = 0),
        (R − mean)/(std + ε); a group whose returns are all equal (one member included) gives 0."""

    def micro_raw_advantage(self, r_micro: Tensor, v_bar: Tensor, anchor_seen: Tensor) -> Tensor:
        """[...] each -> [...]: R_micro − V̄(anchor), and exactly 0 where the anchor is unseen."""

    def micro_advantage(self, raw: Tensor, *, sigma_min: float = 0.1, valid: Tensor | None = None) -> Tensor:
        """[...] -> [...]: (raw − mean)/max(std, σ_min) with mean and population std over the valid
        entries of the whole batch (all entries when ``valid`` is None); invalid entries give 0."""

    def fuse_advantages(self, a_macro: Tensor, a_micro: Tensor, *, beta: float = 0.5) -> Tensor:
        """[B] and [B, T] -> [B, T]: A_total = A_macro (broadcast over steps) + β·A_micro."""

    # ---------------------------------------------------------------- §7.2/§7.3 STDB updates
    def stdb_update(self, stats: Mapping[str, Any], trajectory: Mapping[str, Any], *, v_rate: float = 0.1,
                    alpha_smooth: float = 1.0, distance_exponent: float = 0.5, lam: float = 1.0,
                    eps: float = 1e-8) -> dict[str, Any]:
        """A new state (the input is not modified): every distinct edge of the trajectory gets
        N_total += 1 and N_total_global += 1 (once per trajectory); on success only, N_succ += 1,
        d_sum += (T−1−t_last) and N_succ_total += 1, and each touched anchor's V̄ moves toward the
        edge's fresh Q by V̄ ← (1−η)V̄ + ηQ (V̄ := Q on its first update)."""

    # ---------------------------------------------------------------- §6 objective
    def policy_loss(self, logp_new: Tensor, logp_old: Tensor, logp_ref: Tensor, advantages: Tensor,
                    mask: Tensor, *, clip_eps: float = 0.2, beta_kl: float = 0.04) -> dict[str, Tensor]:
        """[B, T] each (mask bool, True = a real step) -> the dict of ``OUTPUTS["policy_loss"]``:
        loss = −(E_τ[(1/T_τ)Σ_t min(ρA, clip(ρ,1±ε)A)] − β_KL·KL),
        KL(π_θ‖π_ref) by the k3 estimator exp(Δ) − Δ − 1 with Δ = logp_ref − logp_new, averaged the
        same way (per trajectory over its steps, then over trajectories). Gradient flows into
        logp_new only."""

    def defaults(self) -> dict:
        """The defaults table (see the CCAPO-DEFAULT-* clauses)."""

    # ---------------------------------------------------------------- §6 the update loop
    def ccapo_update(self, policy: "torch.nn.Module", ref_policy: "torch.nn.Module",
                     optimizer: "torch.optim.Optimizer", batch: Mapping[str, Tensor], *, clip_eps: float = 0.2,
                     beta_kl: float = 0.04, epochs: int = 4, minibatch_size: int = 64, max_grad_norm: float = 1.0,
                     generator: "torch.Generator | None" = None) -> list[dict]:
        """PPO-clip + KL epochs in place on B stored trajectories. ``policy(obs, legal)`` and
        ``ref_policy(obs, legal)`` -> [b, T, A] log-probabilities (``optimizer`` holds the policy's
        parameters only). ``batch``: obs [B, T, ...], legal [B, T, A] bool, action [B, T] long,
        logp_old [B, T] (cached at sampling), advantage [B, T] (A_total), mask [B, T] bool. Each epoch
        is a fresh shuffle of the trajectories into minibatches of ``minibatch_size`` (every
        trajectory exactly once, the remainder last); each minibatch zeroes the gradients, descends
        the negated objective of ``policy_loss`` on its rows with the KL to π_ref at the stored
        actions (π_ref frozen: no gradient), clips the policy's global gradient norm at
        ``max_grad_norm`` and steps (CCAPO-UPDATE-1). Returns one dict per minibatch: float loss,
        loss_clip, loss_kl, kl_ref, approx_kl, clip_fraction, grad_norm (the policy's gradient norm before
        clipping), int epoch, minibatch. A batch without one of these fields raises (CCAPO-INPUT-3)."""


# The result dict of the policy loss, by key: each key's clause, what it holds, whether it is required.
OUTPUTS = {"policy_loss": {
    "loss": Output("CCAPO-PPO-1", "scalar −(E_τ[(1/T_τ)Σ_t min(ρA, clip(ρ,1±ε)A)] − β_KL·KL), the total"),
    "loss_clip": Output("CCAPO-PPO-1", "scalar, the clipped surrogate alone, averaged per trajectory then over "
                                       "trajectories"),
    "loss_kl": Output("CCAPO-PPO-2", "scalar β_KL·KL, the penalty term of the total"),
    "kl_ref": Output("CCAPO-PPO-2", "scalar KL(π_θ‖π_ref) by k3, averaged like the surrogate"),
    "approx_kl": Output("CCAPO-PPO-1", "scalar estimate of KL(π_old‖π_θ) over real steps, exactly 0 when every "
                                       "ratio is 1 (k1 mean(old − new) or k3 mean((ρ − 1) − log ρ)), detached",
                        required=False),
    "clip_fraction": Output("CCAPO-PPO-1", "scalar share of real steps whose ratio is clipped, detached",
                            required=False),
}}

CONTRACT = CcapoOps
