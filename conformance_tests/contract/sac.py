"""Contract of the ``sac`` family (seed 000, SAC V2). Shapes: B batch, A actions (the vocabulary Σ).

Probabilities are what :meth:`SacOps.masked_softmax` returns (ε-clipped, so illegal entries hold ε);
masks are bool tensors, True = legal. Hyper-parameters are keyword-only. Bad input raises an
exception whose message names the clause (``SAC-INPUT-*``). Floating results keep the floating dtype
of the inputs (SAC-DTYPE-1).
"""
from __future__ import annotations

from typing import Collection, Protocol

import torch
from torch import Tensor

from conformance_tests.contract import Output


class SacOps(Protocol):
    def masked_softmax(self, logits: Tensor, legal_mask: Tensor, *, eps: float = 1e-8) -> Tensor:
        """[B,A] float logits, [B,A] bool mask -> [B,A] probabilities: shift by the max over the legal
        logits, fill illegal logits with -1e9 (the dtype's most negative finite value where -1e9 does
        not fit), softmax, clamp to >= eps as given (raised only to the dtype's smallest normal where
        eps would round to 0). NaN/inf logits (SAC-INPUT-1) or a row with no legal action (SAC-INPUT-2) raise."""

    def legal_set(self, compliance: Tensor, *, eos_index: int, fallback: Tensor, min_legal: int = 3) -> Tensor:
        """[B,V] bool compliance -> [B,V] bool legal set: compliance ∪ {eos}; a row with fewer than
        ``min_legal`` legal actions becomes ``fallback`` ([V] or [B,V] bool whitelist) ∪ {eos}. An
        ``eos_index`` outside [0, V) raises (SAC-INPUT-2); -1 is not "the last id"."""

    def target_entropy(self, legal_mask: Tensor, *, kappa: float = 0.9) -> Tensor:
        """[B,A] bool -> [B] float: κ·log|A(s)| in nats."""

    def entropy(self, probs: Tensor, legal_mask: Tensor) -> Tensor:
        """[B,A] probs, [B,A] bool -> [B]: −Σ over legal actions of π log π."""

    def soft_value(self, probs: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, *, alpha: float) -> Tensor:
        """[B,A] each -> [B]: Σ over legal actions of π (min(q1,q2) − α log π)."""

    def top_p_select(self, probs: Tensor, legal_mask: Tensor, *, p: float) -> Tensor:
        """[B,A] probs, [B,A] bool -> [B,A] bool, detached: the smallest legal set whose mass reaches
        p (never empty). p outside (0, 1] raises (SAC-INPUT-3)."""

    def top_p_probs(self, probs: Tensor, selected: Tensor) -> Tensor:
        """[B,A] probs, [B,A] bool -> [B,A]: π restricted to the selection and renormalised."""

    def top_p_soft_value(self, probs: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, *, alpha: float, p: float) -> Tensor:
        """[B,A] each -> [B]: Σ over the Top-p set P of π_p (min(q1,q2) − α log π_p)."""

    def td_target(self, reward: Tensor, done: Tensor, next_value: Tensor, *, gamma: float) -> Tensor:
        """[B] each (done bool or 0/1 float) -> [B]: r + γ(1−done)V. γ outside (0,1) raises (SAC-INPUT-4)."""

    def critic_loss(self, q1_taken: Tensor, q2_taken: Tensor, target: Tensor, *, delta: float = 1.0) -> Tensor:
        """[B] each -> scalar: mean over the batch of Huber(q1−y) + Huber(q2−y); no gradient into y.
        Mismatched shapes raise (SAC-INPUT-2)."""

    def policy_loss(self, probs: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, *, alpha: float) -> Tensor:
        """[B,A] each -> scalar: mean over the batch of Σ over legal actions of π (α log π − min(q1,q2))."""

    def policy_loss_top_p(self, probs: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, *, alpha: float, p: float) -> Tensor:
        """[B,A] each -> scalar: option B, the same sum over the Top-p set with π_p."""

    def temperature_update(self, log_alpha: Tensor, entropy: Tensor, target_entropy: Tensor, *, lr: float) -> Tensor:
        """scalar log α, [B] H, [B] H_tgt -> new scalar log α = log α + lr·mean(H_tgt − H), with α
        clamped to [1e-4, 2]."""

    def clamp_log_alpha(self, log_alpha: Tensor, *, alpha_min: float = 1e-4, alpha_max: float = 2.0) -> Tensor:
        """scalar -> log α clamped so that α ∈ [alpha_min, alpha_max] (after an optimiser step)."""

    def temperature_loss(self, log_alpha: Tensor, entropy: Tensor, target_entropy: Tensor) -> Tensor:
        """scalar -> scalar J whose gradient in log α is mean(H − H_tgt) (descent raises α on a deficit)."""

    def cql_penalty(self, q_all: Tensor, actions: Tensor, *, lam: float = 0.5, legal_mask: Tensor | None = None) -> Tensor:
        """[B,A] Q of one critic, [B] long actions, optional [B,A] bool legal mask -> scalar
        λ(mean over rows of logsumexp of Q over the legal set − mean Q(o,a_B)); legal_mask=None means
        every action is legal. A row with no legal action raises (SAC-CQL-1, SAC-INPUT-2)."""

    def bc_loss(self, log_probs: Tensor, actions: Tensor, is_demo: Tensor, *, lam: float = 0.1) -> Tensor:
        """[B,A] log π, [B] long, [B] bool -> scalar λ·mean over demo rows of −log π(a*|o) (0 if none)."""

    def soft_update(self, target: Tensor, online: Tensor, *, tau: float) -> Tensor:
        """Tensors of one shape -> τ·online + (1−τ)·target."""

    def ema_update(self, target: Tensor, online: Tensor, *, m: float) -> Tensor:
        """Tensors of one shape -> m·target + (1−m)·online (EMA target encoder)."""

    def popart_step(self, mu: Tensor, var: Tensor, x: Tensor, *, beta: float = 1e-3, eps: float = 1e-8) -> tuple[Tensor, Tensor, Tensor]:
        """Broadcastable tensors -> (normalised x, new μ, new σ²) with μ_t = (1−β)μ + βx,
        σ²_t = (1−β)σ² + β(x−μ_t)², normalised = (x−μ_t)/(σ_t+ε)."""

    def ngram_coverage(self, agent_text: str, ref_text: str, *, n: int = 3, window: int = 64) -> float:
        """Share of the agent's n-grams (last ``window`` chars, with multiplicity) present among the
        reference window's n-grams; 0.0 when the agent has no n-gram yet."""

    def info_nce(self, query: Tensor, positive: Tensor, negatives: Tensor, *, tau: float = 0.07) -> Tensor:
        """[B,d], [B,d], [B,K,d] or [K,d] -> [B] InfoNCE log-ratio (≤ 0); no gradient into positive
        or negatives."""

    def bigram_bonus(self, prev_char: str, char: str, lexicon: Collection[str], *, lam: float = 1.0) -> float:
        """λ if prev_char+char is in the lexicon, else 0."""

    def step_reward(self, cov_norm: Tensor, nce_norm: Tensor, garble: Tensor, illegal: Tensor, *,
                    lam_cov: float = 1.0, lam_nce: float = 0.5, lam_gar: float = 0.1, lam_ill: float = 2.0,
                    illegal_done: bool = False) -> tuple[Tensor, Tensor]:
        """[B] each -> (reward [B], done [B] bool). With illegal_done an illegal step gives exactly
        −λ_ill and done=True."""

    def shaped_reward(self, reward: Tensor, phi_s: Tensor, phi_next: Tensor, done: Tensor, *, gamma: float) -> Tensor:
        """[B] each -> r + γ(1−done)Φ(s') − Φ(s)."""

    def mix_counts(self, batch_size: int, *, rho: float = 0.75) -> tuple[int, int]:
        """-> (n_agent, n_demo) with n_agent = floor(ρB + 1/2), summing to B."""

    def dagger_teacher_ratio(self, step: int, *, start: float = 1.0, end: float = 0.1, horizon: int = 200_000) -> float:
        """Linear anneal from start to end over horizon steps, then constant."""

    def resolve_teacher_action(self, teacher_action: Tensor, legal_mask: Tensor, *, mode: str = "reject",
                               distance: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """[B] long, [B,V] bool -> (action, accepted, is_relabeled). reject: an illegal teacher
        action is not accepted; relabel: it becomes the nearest legal id (|i−j| or ``distance[a*, j]``,
        ties to the lower id) with is_relabeled=True. Legal actions pass unchanged."""

    def defaults(self) -> dict:
        """The defaults table as a dict (keys as in spec clauses SAC-DEFAULT-*)."""

    # ------------------------------------------------------------------ totals and the update step
    def critic_loss_total(self, q1_all: Tensor, q2_all: Tensor, actions: Tensor, target: Tensor, *,
                          legal_mask: Tensor | None = None, delta: float = 1.0, lam_cql: float = 0.5,
                          use_cql: bool = True) -> Tensor:
        """[B,A] Q of each online critic, [B] long actions, [B] target y, optional [B,A] bool legal mask
        -> scalar: mean Huber_δ(Q_1(o,a)−y) + Huber_δ(Q_2(o,a)−y), plus (use_cql) one CQL term per
        critic, log-sum-exp over the legal set; no gradient into y (SAC-CRITIC-2)."""

    def policy_loss_total(self, probs: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, actions: Tensor,
                          is_demo: Tensor, *, alpha: float, lam_bc: float = 0.1, p: float | None = None) -> Tensor:
        """[B,A] ε-clipped probs, [B,A] Q each, [B,A] bool, [B] long, [B] bool -> scalar L_π + L_BC:
        option A (p=None) or option B (Top-p mass p), plus λ_BC·mean over demo rows of −log π(a*|o)
        with the full masked π (SAC-POL-3)."""

    def init_target(self, critic: "torch.nn.Module") -> "torch.nn.Module":
        """nn.Module returning (Q1 [B,A], Q2 [B,A]) -> a module of the same structure whose parameters
        equal the online ones, share no storage with them and do not require grad (SAC-TARGET-2)."""

    def update_step(self, policy: "torch.nn.Module", critic: "torch.nn.Module", target: "torch.nn.Module",
                    log_alpha: Tensor, optimizers: dict, batch: dict, *, gamma: float = 0.995,
                    top_p: float = 0.98, kappa: float = 0.9, tau: float = 0.005, lambda_bc: float = 0.1,
                    lambda_cql: float = 0.5, use_cql: bool = True, policy_use_topp: bool = False,
                    huber_delta: float = 1.0, grad_clip: float = 0.5, alpha_min: float = 1e-4,
                    alpha_max: float = 2.0) -> dict:
        """One update in place. ``policy(obs) -> [B,A]`` logits; ``critic``/``target(obs) -> (Q1, Q2)``
        [B,A] each; ``log_alpha`` scalar leaf tensor; ``optimizers`` {"q", "pi", "alpha"} over the
        critic, policy and [log_alpha]. ``batch``: obs, action [B] long, reward [B], next_obs, done [B]
        bool, is_demo [B] bool, legal_mask and next_legal_mask [B,A] bool. Order (SAC-STEP-1): Top-p
        TD target under no_grad, critic step on critic_loss_total; policy step on policy_loss_total
        against the updated critics; temperature step (temperature_loss on the entropy of the
        pre-step policy, then the α clamp); soft target update. Each network step clips its global
        gradient norm at grad_clip (SAC-GRAD-1). Returns float diagnostics."""

    def nce_queue_push(self, queue: Tensor, keys: Tensor, *, capacity: int) -> Tensor:
        """[K,d] queued negatives, [n,d] new keys -> [min(K+n, capacity), d]: first in, first out (the
        oldest rows leave first, newest last), detached (SAC-NCE-4). Keys that do not fit the queue's
        shape raise (SAC-INPUT-2)."""

    # ------------------------------------------------------------------ logits entry points
    # The same quantities from raw logits and a bool legal mask, for libraries that never expose
    # ε-clipped probabilities. How illegal logits are filled is the ``mask_fill`` convention (seed:
    # the ε-clip of SAC-MASK-1/2; declared alternatives "finite", "neg_inf"); the legal-set sums and
    # the absence of NaN/inf are normative whatever the fill.
    def entropy_from_logits(self, logits: Tensor, legal_mask: Tensor) -> Tensor:
        """[B,A] float logits, [B,A] bool -> [B]: −Σ over legal actions of π log π of the masked policy
        (SAC-ENT-3)."""

    def soft_value_from_logits(self, logits: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, *,
                               alpha: float) -> Tensor:
        """[B,A] each -> [B]: Σ over legal actions of π (min(q1,q2) − α log π), π the masked policy
        (SAC-V-2)."""

    def policy_loss_from_logits(self, logits: Tensor, q1: Tensor, q2: Tensor, legal_mask: Tensor, *,
                                alpha: float) -> Tensor:
        """[B,A] each -> scalar: mean over rows of Σ over legal actions of π (α log π − min(q1,q2));
        gradient only into ``logits`` (SAC-POL-4)."""

    # ------------------------------------------------------------------ loss level
    def losses(self, policy: "torch.nn.Module", critic: "torch.nn.Module", target_critic: "torch.nn.Module",
               batch: dict, *, log_alpha: Tensor, gamma: float, kappa: float = 0.9, delta: float = 1.0,
               top_p: float = 1.0) -> dict:
        """The three SAC losses of one batch, computed, never stepped (SAC-LOSSES-1). Modules are
        the suite's own (``conformance_tests.modules``): ``policy(obs) -> [B,A]`` logits
        (a ``TableModule``), ``critic(obs)`` and ``target_critic(obs) -> (Q1, Q2)`` [B,A] each (a
        ``TwinTable``; its ``.q1``/``.q2`` are ``TableModule``s for libraries with one module per
        critic). ``target_critic`` is a separate module holding the target values. ``log_alpha``: a
        0-d float tensor (may require grad). ``batch``: obs, next_obs (what the modules take; the
        suite passes [B] int64 row indices), action [B] int64, reward [B] float, done [B] bool (a
        termination: no bootstrap), legal_mask and next_legal_mask [B,A] bool; with the
        ``terminated_truncated`` capability also truncated [B] bool (the episode was cut: the target
        still bootstraps). Hyper-parameters: γ of the TD target; κ of the target entropy (seed:
        κ·log|A(s)| per state, the ``target_entropy`` convention); Huber δ of the critic loss (the
        ``huber_delta`` convention); ``top_p`` of the backup (1.0 = the full expectation over the
        legal set, what libraries compute; < 1 is the seed's Top-p backup, SAC-TOPP-3). Illegal
        logits are filled per the ``mask_fill`` convention.

        Returns a dict of tensors with TorchRL's key names, the rows of ``OUTPUTS["losses"]``.
        Extra keys are ignored. α in the actor and the target is exp(log α), detached."""


# The result dict of the loss-level op, by key: each key's clause, what it holds, whether it is required.
OUTPUTS = {"losses": {
    "loss_actor": Output("SAC-POL-1", "scalar, mean_B of Σ over legal actions of π (α log π − min(Q1,Q2)) with "
                                      "the online Q detached; gradient only into the policy (SAC-LOSSES-2)"),
    "loss_qvalue": Output("SAC-CRITIC-1", "scalar, mean_B Σ_i Huber_δ(Q_i(o,a) − y), "
                                          "y = r + γ(1−done)·V_soft(o') "
                                          "from the target critic and the policy at o' (SAC-TD-1, SAC-V-1), no "
                                          "gradient into y; gradient only into the online critics"),
    "loss_alpha": Output("SAC-TEMP-2", "scalar, log α · mean_B(H(o) − H_tgt(o)), H detached (α · mean under the "
                                       "temperature_param convention); gradient only into log α"),
    "entropy": Output("SAC-ENT-2", "scalar, mean_B H(π(·|o)) over the legal set, detached", required=False),
    "alpha": Output("SAC-LOSSES-1", "scalar, the α used, exp(log α), detached", required=False),
    "target_value": Output("SAC-TD-1", "[B], the TD target y, detached", required=False),
}}

CONTRACT = SacOps
