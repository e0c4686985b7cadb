"""Discrete max-entropy SAC on a char-level POMDP (seed 000, V2): the pure math.

Every public function implements one or more clauses of ``spec/sac.yaml``; the trainer and the
environment (``trainer.py``, ``env.py``) call these and never re-derive a formula.
"""
from reference_impl.sac.backup import soft_value, td_target, top_p_probs, top_p_select, top_p_soft_value
from reference_impl.sac.data import dagger_teacher_ratio, mix_counts, resolve_teacher_action
from reference_impl.sac.defaults import defaults
from reference_impl.sac.losses import (
    bc_loss,
    clamp_log_alpha,
    cql_penalty,
    critic_loss,
    critic_loss_total,
    policy_loss,
    policy_loss_top_p,
    policy_loss_total,
    temperature_loss,
    temperature_update,
)
from reference_impl.sac.negatives import nce_queue_push
from reference_impl.sac.masking import entropy, legal_set, masked_softmax, target_entropy
from reference_impl.sac.reward import bigram_bonus, info_nce, ngram_coverage, shaped_reward, step_reward
from reference_impl.sac.step import init_target, update_step
from reference_impl.sac.updates import ema_update, popart_step, soft_update
# after the ``losses`` submodule is imported above: the contract op ``losses`` shadows its name here
# (``from reference_impl.sac.losses import ...`` still reaches the module through sys.modules)
from reference_impl.sac.loss_level import entropy_from_logits, losses, policy_loss_from_logits, soft_value_from_logits

__all__ = [
    "masked_softmax", "legal_set", "target_entropy", "entropy",
    "soft_value", "top_p_select", "top_p_probs", "top_p_soft_value", "td_target",
    "critic_loss", "policy_loss", "policy_loss_top_p", "temperature_update", "temperature_loss",
    "cql_penalty", "bc_loss", "clamp_log_alpha", "soft_update", "ema_update", "popart_step",
    "ngram_coverage", "info_nce", "bigram_bonus", "step_reward", "shaped_reward",
    "mix_counts", "dagger_teacher_ratio", "resolve_teacher_action", "defaults",
    "critic_loss_total", "policy_loss_total", "init_target", "update_step", "nce_queue_push",
    "entropy_from_logits", "soft_value_from_logits", "policy_loss_from_logits", "losses",
]
