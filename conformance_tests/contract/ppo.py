"""Contract of the ``ppo`` family (seed 002, masked PPO / MAPPO). Shapes: B or N rows, A actions.

Masks are bool tensors, True = legal; actions are int64 indices into the last axis; log-probs are
natural logs in the logits' dtype. Hyper-parameters are keyword-only. Bad input raises an exception
whose message names the clause (``PPO-INPUT-*``, ``PPO-MASK-3``, ``PPO-REMAP-2``, ``PPO-MAPPO-1``).
Floating results keep the floating dtype of the inputs (PPO-DTYPE-1).
An adapter may provide any subset: a missing operation makes its clauses *not applicable*.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import Tensor

from conformance_tests.contract import Output


class PpoOps(Protocol):
    # ------------------------------------------------------------------ masking, sampling, replay
    def masked_logits(self, logits: Tensor, mask: Tensor) -> Tensor:
        """[B,A] float logits, [B,A] bool mask -> [B,A]: legal logits unchanged, illegal ones replaced
        by -1e9 (the dtype's most negative finite value where -1e9 does not fit, e.g. float16).
        NaN/inf logits (PPO-INPUT-1), a non-bool mask, mismatched shapes or a row with no legal action
        (PPO-INPUT-2) raise."""

    def masked_distribution(self, logits: Tensor, mask: Tensor) -> torch.distributions.Categorical:
        """[B,A], [B,A] bool -> a ``torch.distributions.Categorical`` (or subclass) over the masked
        logits: ``.probs`` [B,A], ``.log_prob(action [B])`` [B], ``.entropy()`` [B]."""

    def sample_actions(self, logits: Tensor, mask: Tensor, *, generator: torch.Generator | None = None
                       ) -> tuple[Tensor, Tensor]:
        """[B,A], [B,A] bool -> (action [B] int64, old_log_prob [B]): one draw per row from the masked
        policy, and its log-prob cached **detached** (no grad even when logits require grad). Must
        never return an action illegal under its mask (PPO-MASK-2: raise instead)."""

    def evaluate_actions(self, logits: Tensor, mask: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """[B,A], [B,A] bool, [B] int64 -> (new_log_prob [B], entropy [B]), both from one distribution
        object over the masked logits (the stored mask), differentiable in logits. An action illegal
        under the mask raises (PPO-MASK-3); one outside [0, A) raises (PPO-INPUT-3)."""

    # ------------------------------------------------------------------ ratio, KL, losses
    def ratio(self, new_log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
        """[B], [B] -> [B]: exp(new − old)."""

    def approx_kl(self, old_log_prob: Tensor, new_log_prob: Tensor) -> Tensor:
        """[B], [B] -> scalar: mean(old − new) (the document's estimator; may be negative)."""

    def k3_kl(self, old_log_prob: Tensor, new_log_prob: Tensor) -> Tensor:
        """[B], [B] -> scalar: mean((r − 1) − log r), r = exp(new − old); never negative."""

    def clip_fraction(self, ratio: Tensor, *, clip_eps: float) -> Tensor:
        """[B] -> scalar in [0, 1]: share of rows with |r − 1| > clip_eps."""

    def clipped_policy_loss(self, ratio: Tensor, advantage: Tensor, *, clip_eps: float) -> Tensor:
        """[B], [B] -> scalar: −mean(min(r·A, clip(r, 1−ε, 1+ε)·A)); no gradient reaches ``advantage``
        (PPO-GRAD-2). clip_eps outside (0, 1) raises (PPO-INPUT-4)."""

    def value_loss(self, values: Tensor, returns: Tensor) -> Tensor:
        """[B], [B] -> scalar: 0.5·mean((returns − values)²); no gradient reaches ``returns`` (PPO-GRAD-2)."""

    def total_loss(self, policy_loss: Tensor, value_loss: Tensor, entropy: Tensor, *, vf_coef: float,
                   ent_coef: float) -> Tensor:
        """scalars (entropy scalar or [B], averaged) -> scalar: L_π + vf_coef·L_V − ent_coef·mean H."""

    def entropy_ratio(self, entropy: Tensor, mask: Tensor) -> Tensor:
        """[B] per-row entropy, [B,A] bool -> scalar Σ H / Σ log|A(s)| (0 when no row has a choice)."""

    def normalize_advantages(self, advantage: Tensor, *, eps: float = 1e-8, clamp: float | None = None) -> Tensor:
        """[N] -> [N]: (A − mean)/(std + eps) with the Bessel-corrected std (torch's ``.std()``), then
        clamped to [−clamp, clamp] when clamp is given. Fewer than 2 samples or NaN raise (PPO-INPUT-4)."""

    def kl_early_stop(self, approx_kl: float | Tensor, *, target_kl: float = 0.015, factor: float = 2.0) -> bool:
        """True when approx_kl > factor·target_kl (strictly)."""

    def scale_reward(self, reward: Tensor, *, scale: float) -> Tensor:
        """[...] -> [...]: clip(reward / scale, −1, 1). scale <= 0 raises (PPO-INPUT-4)."""

    def clip_grad_norm(self, parameters: list[torch.nn.Parameter], *, max_norm: float) -> Tensor:
        """Scale the ``.grad`` of ``parameters`` in place so their global L2 norm is <= max_norm (up to
        the 1e-6 guard); return the norm before clipping."""

    # ------------------------------------------------------------------ local-index remapping (§5)
    def local_sample(self, logits_row: Tensor, mask_row: Tensor, *, generator: torch.Generator | None = None
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """[A], [A] bool -> (valid_ids [K] int64 ascending, local_idx [] int64 in [0, K),
        action_id [] = valid_ids[local_idx], old_log_prob [] detached, of local_idx under the
        softmax of logits_row[valid_ids])."""

    def local_log_prob(self, logits_row: Tensor, valid_ids: Tensor, local_idx: Tensor) -> Tensor:
        """[A], [K] int64, [] or [N] int64 -> log-prob of local_idx under the rebuilt local
        distribution softmax(logits_row[valid_ids]). local_idx outside [0, K) raises IndexError
        naming PPO-REMAP-2 (no clamping)."""

    # ------------------------------------------------------------------ MAPPO batches (§6)
    def align_batch(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """dict of [N, ...] tensors holding episode_id, timestep, agent_id (int64 [N]) and any
        per-row fields -> the same dict with every field reordered by one permutation that sorts the
        rows lexicographically by (episode_id, timestep, agent_id). A repeated key raises
        (PPO-MAPPO-1); a field with a different row count raises (PPO-INPUT-5)."""

    def check_alignment(self, batch: dict[str, Tensor]) -> None:
        """Return None when the rows are in strictly increasing (episode_id, timestep, agent_id)
        order; raise an error naming PPO-MAPPO-1 otherwise."""

    # ------------------------------------------------------------------ the update loop (§4, §8)
    def ppo_update(self, actor: Callable[[Tensor], Tensor], critic: Callable[[Tensor], Tensor],
                   optimizer: torch.optim.Optimizer, batch: dict[str, Tensor], *, epochs: int,
                   minibatch_size: int, clip_eps: float, vf_coef: float, ent_coef: float,
                   max_grad_norm: float, target_kl: float | None,
                   generator: torch.Generator | None = None) -> list[dict]:
        """Run PPO-Clip on a stored rollout. ``actor(obs) -> [n,A] logits``, ``critic(critic_obs or
        obs) -> [n] values`` (nn.Modules; ``optimizer`` holds their parameters). ``batch``: obs,
        optional critic_obs, action [N] int64, old_log_prob [N] (cached at sampling), mask [N,A]
        bool (the sampling mask), advantage [N] (used as given), return [N]. Per epoch the rows are
        shuffled into minibatches of ``minibatch_size``; each replays the stored action under the
        stored mask against the cached old log-prob (detached), takes mean losses, clips each
        network's gradient norm at ``max_grad_norm`` and steps. When approx_kl > 2·target_kl the
        update stops before stepping on that minibatch. The stored old_log_prob, advantage and return
        receive no gradient (PPO-GRAD-2); each epoch is a fresh shuffle that uses every row exactly
        once, the remainder as a last smaller minibatch, with gradients zeroed before each step
        (PPO-UPDATE-4). Returns one dict per minibatch with float
        values for loss, policy_loss, value_loss, entropy, approx_kl, k3_kl, clip_fraction,
        ratio_mean, ratio_std, log_prob_min and int epoch, minibatch, bool early_stop."""

    def defaults(self) -> dict:
        """The document's numbers as a dict (keys as in spec clauses PPO-DEFAULT-*)."""

    # ------------------------------------------------------------------ §7 self-test and §11 trend
    def log_ratio_excess(self, new_log_prob: Tensor, old_log_prob: Tensor, *, threshold: float = 2.0) -> Tensor:
        """[B], [B] -> scalar in [0, 1]: share of rows with new − old > threshold (strictly), in the
        log-probs' dtype (PPO-SELFTEST-1)."""

    def ratio_std(self, ratio: Tensor) -> Tensor:
        """[B] -> scalar: Bessel-corrected sample std of the ratios (torch's ``.std()``), 0 for one row
        (PPO-RATIO-2)."""

    def entropy_trend(self, entropy: Tensor) -> dict:
        """[U] per-update entropies (U >= 2) -> {slope, intercept (floats) of the least-squares line
        H_u ≈ intercept + slope·u, decreasing: slope < 0, slow: −slope·(U−1) < intercept} (PPO-SLO-6)."""

    # ------------------------------------------------------------------ advantages and the loss level
    def gae(self, reward: Tensor, value: Tensor, next_value: Tensor, done: Tensor, *, gamma: float, lam: float,
            truncated: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """[T] or [B,T] each (time is the LAST axis; ``done``/``truncated`` bool or 0/1 float) ->
        (advantage, returns), same shape and float dtype (PPO-GAE-1, PPO-GAE-2).
        ``next_value[t]`` is V of the state reached by step t (the last step's is the bootstrap of a
        rollout that stops mid-episode). ``done[t]``: step t terminated its episode, so neither the
        bootstrap nor the recursion crosses it. ``truncated[t]`` (only with the
        ``terminated_truncated`` capability): the episode was cut at t, so the recursion stops but
        the bootstrap V(sₜ₊₁) is kept. δ_t = r_t + γ(1−done_t)·next_value_t − value_t,
        A_t = δ_t + γλ(1−done_t)(1−truncated_t)·Aₜ₊₁, returns = A + value. γ, λ in [0, 1]."""

    def losses(self, actor: "torch.nn.Module", critic: "torch.nn.Module", batch: dict[str, Tensor], *,
               clip_eps: float = 0.2, vf_coef: float = 0.5, ent_coef: float = 0.01) -> dict:
        """The PPO-Clip losses of one minibatch, computed, never stepped (PPO-LOSSES-1), with
        TorchRL's key names. Modules are the suite's own (``conformance_tests.modules``):
        ``actor(obs) -> [B,A]`` logits, ``critic(obs) -> [B]`` values (``TableModule`` s). ``batch``:
        obs (the suite passes [B] int64 row indices), action [B] int64, old_log_prob [B] (cached at
        sampling), mask [B,A] bool (the sampling mask), advantage [B] (used as given: no
        normalisation inside), return [B]. The stored action is replayed under the stored mask.

        Returns a dict of tensors, the rows of ``OUTPUTS["losses"]``,
        so that loss_objective + loss_critic + loss_entropy is the total of PPO-LOSS-3. Gradients:
        loss_objective and loss_entropy into the actor only, loss_critic into the critic only;
        none into the batch tensors (PPO-GRAD-2). Extra keys are ignored."""


# The result dict of the loss-level op, by key: each key's clause, what it holds, whether it is required.
OUTPUTS = {"losses": {
    "loss_objective": Output("PPO-LOSS-1", "scalar −mean(min(r·A, clip(r, 1−ε, 1+ε)·A)), r = exp(new − old)"),
    "loss_critic": Output("PPO-LOSS-2", "scalar vf_coef·½·mean((return − V)²); the ½ is the value_loss_factor "
                                        "convention"),
    "loss_entropy": Output("PPO-ENT-1", "scalar −ent_coef·mean H over the legal set"),
    "entropy": Output("PPO-ENT-1", "scalar mean H over the legal set, detached"),
    "clip_fraction": Output("PPO-CLIPFRAC-1", "scalar mean(|r − 1| > ε), detached (clip_fraction convention)"),
    "kl_approx": Output("PPO-KL-1", "scalar mean(old − new), detached (approx_kl convention)"),
}}

CONTRACT = PpoOps
