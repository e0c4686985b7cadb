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


def left_out(reason: str, *ops: str) -> dict[str, str]:
    """``{"family.op": reason}`` for ops an adapter does not provide, all for one reason (an adapter's
    ``LEFT_OUT`` is a merge of these; ``rlconform matrix`` lists them per library)."""
    return dict.fromkeys(ops, reason)


# Ops that exist only in the seeds' own trainers: no general RL library implements them, so every adapter
# that covers the family leaves them out for this reason (merge the families it covers).
SEED_ONLY = {
    "sac": left_out(
        "the seed's character-level text pipeline (seed 000 §3-§8: legal-set fallback, n-gram coverage, "
        "InfoNCE queue, bigram bonus, step reward, potential shaping, dual buffer, DAgger, teacher relabel): "
        "no RL library has it",
        "sac.legal_set", "sac.ngram_coverage", "sac.info_nce", "sac.nce_queue_push", "sac.bigram_bonus",
        "sac.step_reward", "sac.shaped_reward", "sac.mix_counts", "sac.dagger_teacher_ratio",
        "sac.resolve_teacher_action"),
    "ppo": left_out(
        "the seed's self-test and health metrics (seed 002 §7, §11) and local-index remapping (§5): "
        "no RL library computes them",
        "ppo.entropy_ratio", "ppo.log_ratio_excess", "ppo.ratio_std", "ppo.entropy_trend", "ppo.local_sample",
        "ppo.local_log_prob"),
    "ccapo": left_out(
        "CCAPO's STDB credit machinery (seed 004 §3-§5, §7: fingerprints, anchors, edge statistics, Q_STDB, "
        "time-penalised return, loop filter, micro advantage, fusion, STDB updates): no RL library has it",
        "ccapo.fingerprint", "ccapo.abstract_location", "ccapo.anchor", "ccapo.importance", "ccapo.criticality",
        "ccapo.distance_decay", "ccapo.q_stdb", "ccapo.score_steps", "ccapo.macro_return", "ccapo.loop_mask",
        "ccapo.micro_reward", "ccapo.micro_raw_advantage", "ccapo.micro_advantage", "ccapo.fuse_advantages",
        "ccapo.stdb_update"),
    "isreshape": left_out(
        "IS Reshape's own weight (seed 003: gamma(|A|) schedule, reshaped weight and closed form, its loss, "
        "SFT variant and metrics): no RL library has it",
        "isreshape.reward_gamma", "isreshape.reshape_weight", "isreshape.reshape_f", "isreshape.policy_loss",
        "isreshape.sft_loss", "isreshape.loss_metrics", "isreshape.sft_metrics"),
}
DEFAULTS_REASON = ("the seed's table of default numbers: a library's defaults are its own configuration, not an op "
                   "that returns the seed's")


def seed_only(*families: str) -> dict[str, str]:
    """The seed-only ops and the ``defaults`` op of ``families``, with their reasons."""
    out: dict[str, str] = {}
    for f in families:
        out |= SEED_ONLY[f] | {f"{f}.defaults": DEFAULTS_REASON}
    return out


# ----------------------------------------------------------------------------- libraries that step themselves
def step_gradients(step: Callable[[], Any], params: list) -> list:
    """The gradients a library's own update applied to ``params``, for code that calls ``backward()`` and
    ``optimizer.step()`` itself: configure its optimiser as plain SGD with lr 1 (no momentum, no weight decay),
    run ``step``, and read each parameter's change (before − after). Declare the loss keys measured this way
    in ``capabilities["steps_itself"]``."""
    before = [p.detach().clone() for p in params]
    step()
    return [b - p.detach() for b, p in zip(before, params)]


def measured_loss(value: Any, grads: dict) -> Any:
    """``value`` (a detached scalar) as a loss whose gradient into each key of ``grads`` (the suite's own leaf,
    e.g. ``log_alpha``) is the tensor given: :func:`step_gradients` measured in the library's copy of that leaf.
    The suite's gradient checks then see what the library's step did; leaves the library does not step show no
    gradient."""
    import torch

    class _Measured(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v, *leaves):
            return v.detach().clone()

        @staticmethod
        def backward(ctx, g):
            return (None, *[g * grads_[i] for i in range(len(grads_))])

    leaves = [leaf for leaf in grads if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
    grads_ = [grads[leaf].to(leaf.dtype).reshape(leaf.shape) for leaf in leaves]
    return _Measured.apply(torch.as_tensor(value).detach(), *leaves)
