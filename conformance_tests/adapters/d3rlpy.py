"""d3rlpy 2.7 discrete SAC behind the sac contract (``rlconform audit --impl
conformance_tests.adapters.d3rlpy:make --family sac``).

Every op builds a tiny ``DiscreteSAC`` through ``DiscreteSACConfig(...).create().create_impl(...)``, so
d3rlpy's own wiring (``DiscreteSAC.inner_create_impl``, algos/qlearning/sac.py:289-367) assembles the
``DiscreteSACImpl``. The suite's tables enter through d3rlpy's extension point for custom networks, an
``EncoderFactory`` (models/encoders.py:29): each encoder returns row ``i`` of a table for observation ``i``,
and the linear head d3rlpy puts on it (``CategoricalPolicy._fc``, ``DiscreteMeanQFunction._fc``) is set to
the identity, so logits and Q-values are the tables and gradients land on them. The ops then call
``DiscreteSACImpl``'s methods: ``compute_target`` and ``compute_critic_loss`` (what ``update_critic``
backpropagates) and ``compute_actor_loss``, which steps the temperature itself (``update_temp``) before it
builds the actor loss. Batches go through d3rlpy's ``TransitionMiniBatch`` -> ``TorchMiniBatch.from_batch``.
Paths in comments are under ``site-packages/d3rlpy/``.
"""
from __future__ import annotations

import dataclasses
import math
import types

from conformance_tests.adapters import left_out, measured_loss, seed_only, step_gradients
from conformance_tests.errors import NotApplicable
from conformance_tests.modules import TableModule

CAPABILITIES = {
    "masks": False,  # models/torch/policies.py:157-158 Categorical(logits=...); no mask in sac_impl.py anywhere
    # float32 only: batches are cast to float32 (torch_utility.py:94-97 convert_to_torch), log temp is created
    # float32 (models/builders.py:287), the twin critic loss accumulates into a float32 tensor
    # (models/torch/q_functions/ensemble_q_function.py:90-94, :105)
    "dtypes": ["float32"],
    "train_dtype": "float32",
    "pinned": {"sac.losses": {"kappa": 0.98}},  # algos/qlearning/torch/sac_impl.py:283 0.98 * (-log(1/A))
    "steps_itself": {"sac.losses": ["loss_alpha"]},  # sac_impl.py:261-262 -> :277, :288-289 backward + step
    "conventions": {
        # models/torch/q_functions/mean_q_function.py:73 compute_huber_loss(value, y): beta default 1.0,
        # q_functions/utility.py:36-41; no argument reaches it from the config
        "huber_delta": "fixed_1",
        "target_entropy": "scalar",  # sac_impl.py:283 one number, 0.98 * log(action_size), for every state
        "temperature_param": "alpha",  # sac_impl.py:286 -(log_temp.exp() * targ_temp).mean()
        # sac_impl.py:266-271 temp = log_temp.exp() undetached in the actor loss; the actor optimiser covers the
        # policy only (algos/qlearning/sac.py:332-336) and update_temp zeroes log temp's gradient first (:277)
        "alpha_in_actor_loss": "attached_unstepped",
        "alpha_clamp": "none",  # sac_impl.py:286-289 plain optimiser step on log temp, never clamped
    },
}

# The sac contract ops this adapter does not provide, and why.
LEFT_OUT = {
    **seed_only("sac"),
    "sac.masked_softmax": "no action masks in d3rlpy's discrete SAC (CategoricalPolicy builds Categorical(logits=...), "
                          "models/torch/policies.py:157-158)",
    **left_out("d3rlpy has no function for it: computed inline from the policy's Categorical inside "
               "DiscreteSACImpl (entropy: update_temp, sac_impl.py:279-282; soft value: compute_target, :202-220; "
               "policy loss: compute_actor_loss, :251-272); reached through sac.losses, sac.soft_value_from_logits "
               "and sac.policy_loss_from_logits",
               "sac.entropy", "sac.soft_value", "sac.policy_loss", "sac.entropy_from_logits"),
    **left_out("no Top-p backup: compute_target takes the full expectation over actions (sac_impl.py:220)",
               "sac.top_p_select", "sac.top_p_probs", "sac.top_p_soft_value", "sac.policy_loss_top_p"),
    "sac.target_entropy": "hard-coded inside update_temp, 0.98 * log(action_size) (sac_impl.py:283): no function of "
                          "a legal mask (declared pinned kappa 0.98 and target_entropy scalar)",
    "sac.td_target": "y = r + gamma * V' * (1 - terminal) is formed inside DiscreteMeanQFunctionForwarder."
                     "compute_error (models/torch/q_functions/mean_q_function.py:72) and only its Huber loss comes "
                     "back: reached through sac.losses",
    "sac.critic_loss": "compute_error (mean_q_function.py:58-74) takes reward, next value and terminal and forms y "
                       "itself: no entry point takes a TD target y; reached through sac.losses",
    "sac.critic_loss_total": "no CQL term in DiscreteSAC (d3rlpy's DiscreteCQL is another algorithm, on one "
                             "Q-function without a policy); the twin critic loss is reached through sac.losses",
    "sac.policy_loss_total": "no behaviour-cloning term in DiscreteSAC; its actor loss is reached through sac.losses "
                             "and sac.policy_loss_from_logits",
    "sac.temperature_loss": "update_temp (sac_impl.py:274-294) takes the policy's distribution, not an entropy and a "
                            "target, and steps log temp itself: reached through sac.losses (steps_itself loss_alpha)",
    "sac.temperature_update": "update_temp reads the entropy from the policy's distribution and hard-codes its "
                              "target (sac_impl.py:280-283): no entry point takes given entropies and targets",
    "sac.clamp_log_alpha": "log temp is never clamped (sac_impl.py:286-289; declared alpha_clamp none)",
    "sac.cql_penalty": "no CQL penalty in DiscreteSAC (DiscreteCQL is another algorithm, on its own Q-function)",
    "sac.bc_loss": "no behaviour-cloning term in DiscreteSAC",
    **left_out("DiscreteSAC copies its targets outright every target_update_interval steps (hard_sync, "
               "sac_impl.py:302-303, :314-315; torch_utility.py:69-74): no soft target update; d3rlpy's soft_sync "
               "belongs to its continuous algorithms", "sac.soft_update", "sac.ema_update"),
    "sac.init_target": "the targets are built by the config (algos/qlearning/sac.py:301-309) and hard-synced in "
                       "DiscreteSACImpl.__init__ (sac_impl.py:186): no function of a given critic module",
    "sac.popart_step": "no PopArt normaliser in d3rlpy",
    "sac.update_step": "not adapted yet: inner_update (sac_impl.py:296-304) runs its own OptimizerWrappers in its own "
                       "order (critic step, temperature step, actor loss against the stepped temperature, hard target "
                       "sync every target_update_interval steps), with no CQL, BC, Top-p or per-network clip",
}


def make() -> types.SimpleNamespace:
    import d3rlpy
    import numpy as np
    import torch
    from d3rlpy.algos import DiscreteSACConfig
    from d3rlpy.dataset import TransitionMiniBatch
    from d3rlpy.models.encoders import EncoderFactory
    from d3rlpy.models.q_functions import MeanQFunctionFactory
    from d3rlpy.models.torch import get_parameter
    from d3rlpy.optimizers import SGDFactory
    from d3rlpy.torch_utility import TorchMiniBatch, hard_sync

    class Rows(torch.nn.Module):
        """A d3rlpy encoder: observation [B, 1] (a row index, float32 as d3rlpy's batches hold it) -> row i of a
        suite table module, or of a caller's tensor (gradients reach that tensor)."""

        def __init__(self, source):
            super().__init__()
            if isinstance(source, torch.nn.Module):
                self.source = source
            else:
                self.live = source
                # compute_output_size reads the device from a parameter (models/torch/encoders.py:364)
                self.anchor = torch.nn.Parameter(source.new_zeros(0))

        def forward(self, x):
            index = x.reshape(-1).long()
            return self.source(index) if "source" in self._modules else self.live[index]

    @dataclasses.dataclass()
    class Tables(EncoderFactory):  # d3rlpy's custom-encoder extension point (models/encoders.py:29-39)
        sources: list = dataclasses.field(default_factory=list)

        def create(self, observation_shape):  # called once per network, in creation order (sac.py:292-316)
            return Rows(self.sources.pop(0))

        @staticmethod
        def get_type() -> str:
            return "rlconform_tables"

    def device_of(t) -> str:
        return f"{t.device.type}:{t.device.index or 0}"

    def build(policy, critics, targets, n_act, *, gamma, alpha, temp_lr=None, device):
        """A DiscreteSACImpl from d3rlpy's own config and wiring; the linear heads are the identity. ``temp_lr``
        None keeps d3rlpy's temperature optimiser (Adam, lr 3e-4: what users get); a number makes it plain SGD
        at that rate (1: the measuring device of steps_itself; 0: no temperature optimiser at all)."""
        temp = {} if temp_lr is None else {"temp_learning_rate": temp_lr, "temp_optim_factory": SGDFactory()}
        config = DiscreteSACConfig(actor_encoder_factory=Tables([policy]),
                                   critic_encoder_factory=Tables([*critics, *targets]),  # q_funcs, then targets
                                   q_func_factory=MeanQFunctionFactory(), n_critics=2, gamma=gamma,
                                   initial_temperature=alpha, **temp)
        algo = config.create(device=device)
        algo.create_impl((1,), n_act)
        impl = algo.impl
        m = impl.modules
        with torch.no_grad():  # policies.py:155 and mean_q_function.py:33 nn.Linear(hidden, A) on the table row
            for net in (m.policy, *m.q_funcs, *m.targ_q_funcs):
                net._fc.weight.copy_(torch.eye(n_act))
                net._fc.bias.zero_()
        return impl

    def minibatch(obs, next_obs, action, reward, done, device):
        """The batch as d3rlpy's replay buffer hands it over: float32 [B, 1] arrays -> TorchMiniBatch."""
        col = lambda t: np.asarray(t.detach().cpu(), dtype=np.float32).reshape(len(t), -1)  # noqa: E731
        ones = np.ones((len(obs), 1), dtype=np.float32)
        mb = TransitionMiniBatch(observations=col(obs), actions=col(action), rewards=col(reward),
                                 next_observations=col(next_obs), next_actions=0 * ones, terminals=col(done),
                                 intervals=ones, transitions=[])
        return TorchMiniBatch.from_batch(mb, gamma=1.0, compute_returns_to_go=False, device=device)

    def no_masks(*masks):
        if any(not bool(m.all()) for m in masks):
            raise NotApplicable("d3rlpy's discrete SAC has no action masks (policies.py:157-158)")

    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.98, delta=1.0, top_p=1.0):
        if top_p < 1.0 or delta != 1.0 or kappa != 0.98:
            raise NotApplicable("the backup is the full expectation, Huber beta is 1, the entropy ratio is 0.98 "
                                "(sac_impl.py:220, q_functions/utility.py:37, sac_impl.py:283)")
        no_masks(batch["legal_mask"], batch["next_legal_mask"])
        n_act, device = batch["legal_mask"].shape[-1], device_of(policy.table)
        alpha = math.exp(float(log_alpha.detach()))

        def impl_with(temp_lr):
            impl = build(policy, [critic.q1, critic.q2], [TableModule(critic.q1.table), TableModule(critic.q2.table)],
                         n_act, gamma=gamma, alpha=alpha, temp_lr=temp_lr, device=device)
            for targ, src in zip(impl.modules.targ_q_funcs, (target_critic.q1, target_critic.q2)):
                hard_sync(targ.encoder.source, src)  # the suite's target values, as a target update would copy them
            return impl

        tb = minibatch(batch["obs"], batch["next_obs"], batch["action"], batch["reward"], batch["done"], device)
        impl = impl_with(None)  # d3rlpy's own temperature optimiser, as users train
        # critic: what update_critic backpropagates (sac_impl.py:192-193), target under no_grad (:203)
        loss_q = impl.compute_critic_loss(tb, impl.compute_target(tb))
        # actor: compute_actor_loss calls update_temp first (:261-262), which backpropagates and steps log temp
        # (:288-289), then builds the actor loss with the stepped temperature (:266-271)
        loss_actor = impl.compute_actor_loss(tb)["loss"]
        # the temperature loss's gradient, measured on a twin whose temperature optimiser is SGD at lr 1
        measuring, actor = impl_with(1.0), {}
        (grad,) = step_gradients(lambda: actor.update(measuring.compute_actor_loss(tb)),
                                 [get_parameter(measuring.modules.log_temp)])
        # d3rlpy reports no entropy (optional in OUTPUTS["losses"]) and no alpha (it uses two in one call)
        return {"loss_actor": loss_actor, "loss_qvalue": loss_q,
                "loss_alpha": measured_loss(actor["temp_loss"], {log_alpha: grad})}

    def logits_impl(logits, q1, q2, legal_mask, alpha):
        """A fixed-temperature DiscreteSAC (temp_learning_rate 0: no temperature optimiser, sac.py:337-345) whose
        policy is the caller's logits and whose online and target critics are the caller's Q-values."""
        no_masks(legal_mask)
        device = device_of(logits)
        impl = build(logits, [q1, q2], [q1, q2], logits.shape[-1], gamma=0.5, alpha=alpha, temp_lr=0.0,
                     device=device)
        rows = torch.arange(logits.shape[0])
        zero = torch.zeros(len(rows))
        return impl, minibatch(rows, rows, zero, zero, zero, device)

    def soft_value_from_logits(logits, q1, q2, legal_mask, *, alpha):
        impl, tb = logits_impl(logits, q1, q2, legal_mask, alpha)
        return impl.compute_target(tb).reshape(-1)  # sac_impl.py:202-220: Σ π (min Q_targ − α log π) at next obs

    def policy_loss_from_logits(logits, q1, q2, legal_mask, *, alpha):
        impl, tb = logits_impl(logits, q1, q2, legal_mask, alpha)
        return impl.compute_actor_loss(tb)["loss"]  # sac_impl.py:251-272, no update_temp without temp_optim

    sac = types.SimpleNamespace(losses=losses, soft_value_from_logits=soft_value_from_logits,
                                policy_loss_from_logits=policy_loss_from_logits)
    return types.SimpleNamespace(name="d3rlpy DiscreteSAC", version=d3rlpy.__version__, capabilities=CAPABILITIES,
                                 sac=sac)
