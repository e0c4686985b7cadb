"""Adapters that expose third-party libraries through the rlconform contract, for audits.

Each adapter module has a factory ``make()`` (``--impl conformance_tests.adapters.NAME:make``). An
adapter maps contract operations onto the library's own API and leaves out every operation the
library does not provide, so those clauses are reported *not applicable*; it never re-implements
the suite's math. The library is imported lazily, inside ``make()``, so the suite runs without it.
"""
from __future__ import annotations

from typing import Any, Callable


def distribution_ops(dist: Callable[[Any, Any], Any]) -> dict[str, Callable]:
    """The ppo family's masked-distribution ops for a library whose masked categorical is built as
    ``dist(logits, mask)`` and samples from torch's global RNG (as TorchRL's and sb3's do): draws are seeded
    from the suite's generator inside a forked RNG, so they are reproducible and leave the global RNG alone;
    sampling runs under no_grad, as the libraries' collectors do (the log-prob is cached as data)."""
    import torch

    def masked_distribution(logits, mask):
        return dist(logits, mask)

    def sample_actions(logits, mask, *, generator=None):
        with torch.no_grad(), torch.random.fork_rng():
            if generator is not None:
                torch.manual_seed(int(torch.randint(2 ** 62, (1,), generator=generator)))
            d = dist(logits, mask)
            action = d.sample()
            return action, d.log_prob(action)

    def evaluate_actions(logits, mask, action):
        d = dist(logits, mask)
        return d.log_prob(action), d.entropy()

    return {"masked_distribution": masked_distribution, "sample_actions": sample_actions,
            "evaluate_actions": evaluate_actions}
