"""Masked PPO / MAPPO (seed 002): the pure math and the update loop.

Every public function implements clauses of ``spec/ppo.yaml``; the trainers (``trainer.py``,
``mappo_trainer.py``) call these and never re-derive a formula.
"""
from reference_impl.ppo.defaults import defaults
from reference_impl.ppo.losses import (
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    entropy_ratio,
    entropy_trend,
    k3_kl,
    log_ratio_excess,
    kl_early_stop,
    normalize_advantages,
    ratio,
    ratio_std,
    scale_reward,
    total_loss,
    value_loss,
)
from reference_impl.ppo.mappo import align_batch, check_alignment
from reference_impl.ppo.masking import evaluate_actions, masked_distribution, masked_logits, sample_actions
from reference_impl.ppo.remap import local_log_prob, local_sample
from reference_impl.ppo.update import clip_grad_norm, ppo_update
# The contract ops ``gae`` and ``losses`` share their names with submodules (``gae.py``, the trainers'
# time-major estimator, and ``losses.py``): load both submodules first, then bind the ops, so a later
# ``import reference_impl.ppo.gae`` finds the module in sys.modules and leaves these names alone.
import reference_impl.ppo.gae  # noqa: E402,F401  (before the binding below)
from reference_impl.ppo.advantage import gae  # noqa: E402
from reference_impl.ppo.loss_level import losses  # noqa: E402

__all__ = [
    "masked_logits", "masked_distribution", "sample_actions", "evaluate_actions",
    "ratio", "approx_kl", "k3_kl", "clip_fraction", "clipped_policy_loss", "value_loss", "total_loss",
    "entropy_ratio", "normalize_advantages", "kl_early_stop", "scale_reward", "clip_grad_norm",
    "local_sample", "local_log_prob", "align_batch", "check_alignment", "ppo_update", "defaults",
    "log_ratio_excess", "ratio_std", "entropy_trend", "gae", "losses",
]
