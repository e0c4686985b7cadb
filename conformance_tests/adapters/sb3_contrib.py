"""sb3-contrib's ``MaskableCategorical`` behind the ppo contract (``rlconform audit --impl
conformance_tests.adapters.sb3_contrib:make --family ppo``).

Only the masked categorical distribution is exposed: ``masked_distribution``, ``sample_actions``
and ``evaluate_actions``, each a direct use of ``sb3_contrib.common.maskable.distributions.
MaskableCategorical`` (``masks=`` at construction, ``.sample()``, ``.log_prob()``, ``.entropy()``).
Sampling runs under ``torch.no_grad()``, as ``MaskablePPO.collect_rollouts`` does. Every other
operation of the contract (losses, remapping, MAPPO batches, the update loop, defaults) has no
counterpart in that class and is left out: its clauses are not applicable.
"""
from __future__ import annotations

import types


def make() -> types.SimpleNamespace:
    import sb3_contrib
    import torch
    from sb3_contrib.common.maskable.distributions import MaskableCategorical

    def masked_distribution(logits, mask):
        return MaskableCategorical(logits=logits, masks=mask)

    def sample_actions(logits, mask, *, generator=None):
        # MaskableCategorical.sample() takes no generator: draws come from torch's global RNG
        with torch.no_grad():
            dist = MaskableCategorical(logits=logits, masks=mask)
            action = dist.sample()
            return action, dist.log_prob(action)

    def evaluate_actions(logits, mask, action):
        dist = MaskableCategorical(logits=logits, masks=mask)
        return dist.log_prob(action), dist.entropy()

    ppo = types.SimpleNamespace(masked_distribution=masked_distribution, sample_actions=sample_actions,
                                evaluate_actions=evaluate_actions)
    return types.SimpleNamespace(name="sb3-contrib MaskableCategorical", version=sb3_contrib.__version__, ppo=ppo)
