"""IS Reshape v4 (seed 003): reward-modulated SFT-RL interpolation with a SAPO-style soft trust region.

Every public function implements clauses of ``spec/isreshape.yaml``; ``trainer.py`` calls these and
never re-derives a formula.
"""
from reference_impl.isreshape.aggregate import aggregate_loss
from reference_impl.isreshape.defaults import defaults
from reference_impl.isreshape.losses import loss_metrics, policy_loss, sft_loss
from reference_impl.isreshape.sft_metrics import sft_metrics
from reference_impl.isreshape.objective import reshape_f, sapo_gate
from reference_impl.isreshape.weights import (
    importance_ratio, reshape_weight, reward_gamma, sapo_weight, sapo_weight_signed,
)

__all__ = [
    "importance_ratio", "reward_gamma", "sapo_weight", "sapo_weight_signed", "reshape_weight",
    "reshape_f", "sapo_gate", "policy_loss", "sft_loss", "loss_metrics", "defaults",
    "sft_metrics", "aggregate_loss",
]
