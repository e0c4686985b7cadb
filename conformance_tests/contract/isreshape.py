"""Contract of the ``isreshape`` family (seed 003, IS Reshape v4.0). Shapes: T tokens (any shape).

Token tensors (``log_prob`` = log π_θ, ``ref_log_prob`` = log μ of the behaviour policy,
``advantages`` = A, ``response_mask`` = 1/0 float or bool) share one shape. Ratios r = π/μ are
finite and non-negative. ``gamma`` is a float or a tensor broadcastable to the ratio, in [0, 1].
Hyper-parameters are keyword-only. Results keep the input dtype (half inputs may be computed in
float32). Bad input raises an exception whose message names the clause (``ISR-INPUT-*``).
"""
from __future__ import annotations

from typing import Protocol

from torch import Tensor


class IsReshapeOps(Protocol):
    def importance_ratio(self, log_prob: Tensor, ref_log_prob: Tensor, *, log_ratio_clamp: float = 20.0) -> Tensor:
        """[T], [T] -> [T]: exp(clamp(log π − log μ, −c, c)), c = 20."""

    def reward_gamma(self, advantages: Tensor, *, beta: float = 1.0, gamma_min: float = 0.0,
                     gamma_max: float = 1.0) -> Tensor:
        """[T] A -> [T] γ = γ_min + (γ_max − γ_min)·σ(β|A|). β < 0 (ISR-INPUT-3) or γ bounds outside
        0 ≤ γ_min ≤ γ_max ≤ 1 (ISR-INPUT-4) raise."""

    def sapo_weight(self, ratio: Tensor, *, tau: float = 1.0) -> Tensor:
        """[T] r -> [T] r·sech²(τ(r−1)/2). τ ≤ 0 raises (ISR-INPUT-3)."""

    def sapo_weight_signed(self, ratio: Tensor, advantages: Tensor, *, tau_pos: float, tau_neg: float) -> Tensor:
        """[T] r, [T] A -> [T] r·sech²(τ_A(r−1)/2) with τ_A = τ_pos where A > 0 and τ_neg elsewhere (SAPO's rule)."""

    def reshape_weight(self, ratio: Tensor, gamma: float | Tensor, *, tau: float = 1.0) -> Tensor:
        """[T] r, γ -> [T] w_γ(r) = (1 − γ) + γ·r·sech²(τ(r−1)/2)."""

    def reshape_f(self, ratio: Tensor, gamma: float | Tensor, *, tau: float = 1.0) -> Tensor:
        """[T] r > 0, γ -> [T] f_γ(r) = (1 − γ)·log r + γ·(2/τ)·tanh(τ(r−1)/2); differentiable in r."""

    def sapo_gate(self, ratio: Tensor, *, tau: float = 1.0) -> Tensor:
        """[T] r -> [T] f_SAPO(r) = σ(τ(r−1))·4/τ; differentiable in r."""

    def policy_loss(self, log_prob: Tensor, ref_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                    tau: float = 1.0, beta: float = 1.0, gamma_min: float = 0.0, gamma_max: float = 1.0,
                    log_ratio_clamp: float = 20.0, mask_eps: float = 1e-8) -> Tensor:
        """[T] each -> scalar −Σ w̄·A·log π·m / (Σm + ε), w̄ = w_γ(r) with γ = γ(|A|), detached. Its gradient in
        log π is −w·A·m/(Σm + ε); no gradient reaches ref_log_prob or advantages."""

    def sft_loss(self, log_prob: Tensor, ref_log_prob: Tensor, response_mask: Tensor, *, tau: float = 1.0,
                 gamma_sft: float = 0.2, log_ratio_clamp: float = 20.0, mask_eps: float = 1e-8) -> Tensor:
        """[T] each -> scalar −Σ w̄·log π·m / (Σm + ε), w̄ = w_γ(r) with γ = γ_sft, detached."""

    def loss_metrics(self, log_prob: Tensor, ref_log_prob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                     tau: float = 1.0, beta: float = 1.0, gamma_min: float = 0.0, gamma_max: float = 1.0,
                     log_ratio_clamp: float = 20.0) -> dict[str, float]:
        """[T] each -> {gamma_mean, gamma_std, weight_mean, weight_max, sapo_weight_mean, ratio_mean,
        abs_adv_mean, kl}: masked means Σx·m/Σm (kl of −log r, clamped), gamma_std Bessel-corrected over
        masked tokens (0.0 for one token), weight_max over masked tokens. An empty mask raises (ISR-INPUT-1)."""

    def defaults(self) -> dict:
        """The defaults table as a dict (keys as in spec clauses ISR-DEFAULT-*)."""

    def sft_metrics(self, log_prob: Tensor, ref_log_prob: Tensor, response_mask: Tensor, *, tau: float = 1.0,
                    gamma_sft: float = 0.2, log_ratio_clamp: float = 20.0) -> dict[str, float]:
        """[T] each -> {gamma: γ_sft, weight_mean: Σ w_γ(r)·m / Σm with γ = γ_sft, ratio_mean: Σ r·m / Σm}, r the
        clamped ratio; an empty mask raises (ISR-METRIC-4, ISR-INPUT-1)."""

    # ------------------------------------------------------------------ loss aggregation
    def aggregate_loss(self, loss_mat: Tensor, mask: Tensor, *, mode: str = "token-mean") -> Tensor:
        """[B,T] per-token losses, [B,T] mask (bool or 0/1 float) -> scalar (ISR-AGG-1):
          token-mean           Σ l·m / Σ m (the seed's normalisation; a guard ε ≤ 1e-8 may be added)
          seq-mean-token-mean  mean over rows with Σ_t m > 0 of Σ_t l·m / Σ_t m
          seq-mean-token-sum   mean over rows with Σ_t m > 0 of Σ_t l·m
          token-sum            Σ l·m
        Masked-out entries never contribute, whatever they hold (finite); rows with no token are
        left out of the seq means. An all-zero mask raises (ISR-INPUT-1); an unknown mode raises (ISR-AGG-1)."""


CONTRACT = IsReshapeOps
