"""Mutants of the ppo family: the anti-patterns of seed 002 §12 and §5, one operation each."""
from __future__ import annotations

import functools

import torch
from torch.distributions import Categorical

from conformance_tests.mutants import deaf_to, mutant, override
from reference_impl.ppo import mappo, masking, update


def _update_with(step):
    """A ppo_update whose minibatch step is ``step`` (the reference loop otherwise)."""
    return functools.partial(update.run_update, step=step)


# ----------------------------------------------------------------------------- update-time distribution
@mutant("PPO-MASK-3", doc="The update scores the action under another distribution than the sampling one: "
        "uniform over all actions (the §0 symptom: new_log_prob = -log|A|, entropy = log|A|).", source="002 §0, §12")
def uniform_at_update(ref):
    def evaluate_actions(logits, mask, action):
        dist = Categorical(logits=torch.zeros_like(logits))
        return dist.log_prob(action), dist.entropy()

    return override(ref, "ppo", evaluate_actions=evaluate_actions)


@mutant("PPO-LOGP-1", doc="log(action_probs[idx]) by hand: -inf once a legal probability underflows.",
        source="002 §2, §12")
def hand_log_of_probs(ref):
    def evaluate_actions(logits, mask, action):
        probs = torch.softmax(ref.ppo.masked_logits(logits, mask), -1)
        p = probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return torch.log(p), -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)

    return override(ref, "ppo", evaluate_actions=evaluate_actions)


@mutant("PPO-MASK-4", doc="Normalises the masked logits without shifting by the row max: in float16 the "
        "log-probs lose an ulp of the largest logit (0.125 nats near 128).", source="002 §3")
def unshifted_normalisation(ref):
    def evaluate_actions(logits, mask, action):
        dist = Categorical(logits=ref.ppo.masked_logits(logits, mask), validate_args=False)
        return dist.log_prob(action), dist.entropy()

    return override(ref, "ppo", evaluate_actions=evaluate_actions)


# ----------------------------------------------------------------------------- old log-prob
@mutant("PPO-OLD-1", doc="old_log_prob is cached without .detach(): it stays on the sampling graph.",
        source="002 §2, §12")
def old_log_prob_not_detached(ref):
    def sample_actions(logits, mask, *, generator=None):
        dist = masking.masked_distribution(logits, mask)
        action = torch.multinomial(dist.probs.detach().float(), 1, generator=generator).squeeze(-1)
        return action, dist.log_prob(action)

    return override(ref, "ppo", sample_actions=sample_actions)


@mutant("PPO-OLD-1", "PPO-UPDATE-2", doc="old_log_prob recomputed with the current policy at every minibatch: "
        "ratio is always 1, approx_kl always 0, the clip never acts.", source="002 §12")
def old_log_prob_recomputed(ref):
    def step(actor, critic, mb, *, clip_eps, vf_coef, ent_coef):
        logits = actor(mb["obs"])
        old = masking.evaluate_actions(logits, mb["mask"], mb["action"])[0].detach()
        values = critic(mb.get("critic_obs", mb["obs"])).reshape(-1)
        return update.loss_terms(logits, values, mb, old_log_prob=old, clip_eps=clip_eps, vf_coef=vf_coef,
                                 ent_coef=ent_coef)

    return override(ref, "ppo", ppo_update=_update_with(step))


@mutant("PPO-OLD-1", "PPO-UPDATE-3", doc="The update uses old_log_prob without .detach(): at ratio 1 the "
        "policy gradient cancels through the old log-prob.", source="002 §2, §12")
def old_log_prob_not_detached_in_update(ref):
    def step(actor, critic, mb, *, clip_eps, vf_coef, ent_coef):
        logits = actor(mb["obs"])
        values = critic(mb.get("critic_obs", mb["obs"])).reshape(-1)
        return update.loss_terms(logits, values, mb, old_log_prob=mb["old_log_prob"], clip_eps=clip_eps,
                                 vf_coef=vf_coef, ent_coef=ent_coef)

    return override(ref, "ppo", ppo_update=_update_with(step))


# ----------------------------------------------------------------------------- reductions
@mutant("PPO-LOSS-1", "PPO-LOSS-2", "PPO-LOSS-4", doc=".sum() in place of .mean() in the policy and value losses.",
        source="002 §2, §12")
def sum_instead_of_mean(ref):
    def clipped_policy_loss(ratio, advantage, *, clip_eps):
        return -torch.min(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage).sum()

    def value_loss(values, returns):
        return 0.5 * (returns - values).pow(2).sum()

    return override(ref, "ppo", clipped_policy_loss=clipped_policy_loss, value_loss=value_loss)


@mutant("PPO-LOSS-4", doc="The update sums the per-sample loss over the minibatch (the step grows with the batch).",
        source="002 §2, §12")
def sum_in_update(ref):
    def step(actor, critic, mb, **kw):
        loss, metrics = update.minibatch_loss(actor, critic, mb, **kw)
        n = len(mb["action"])
        return loss * n, {**metrics, "loss": metrics["loss"] * n}

    return override(ref, "ppo", ppo_update=_update_with(step))


@mutant("PPO-GRAD-1", doc="Gradient clipping forgotten: the norm is reported, the gradients are left as they are.",
        source="002 §4")
def no_grad_clip(ref):
    def clip_grad_norm(parameters, *, max_norm):
        return torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in parameters]))

    return override(ref, "ppo", clip_grad_norm=clip_grad_norm)


@mutant("PPO-KLSTOP-1", doc="§11's reading of the guard: stop only above 0.05 instead of 2 x target_kl = 0.03.",
        source="002 §11 (errata)")
def kl_stop_at_slo_threshold(ref):
    def kl_early_stop(approx_kl, *, target_kl=0.015, factor=2.0):
        return float(approx_kl) > 0.05

    return override(ref, "ppo", kl_early_stop=kl_early_stop)


# ----------------------------------------------------------------------------- local-index remapping
@mutant("PPO-REMAP-1", doc="log_prob of the global action id under the local distribution, although sampling "
        "used local indices.", source="002 §5, §12")
def global_id_log_prob(ref):
    def local_log_prob(logits_row, valid_ids, local_idx):
        return Categorical(logits=logits_row[valid_ids]).log_prob(valid_ids[local_idx])

    return override(ref, "ppo", local_log_prob=local_log_prob)


@mutant("PPO-REMAP-2", doc="min(idx, len-1) fallback: an out-of-range local index becomes the last legal action.",
        source="002 §5, §12")
def min_idx_fallback(ref):
    def local_log_prob(logits_row, valid_ids, local_idx):
        safe = torch.clamp(local_idx, 0, len(valid_ids) - 1)
        return Categorical(logits=logits_row[valid_ids], validate_args=False).log_prob(safe)

    return override(ref, "ppo", local_log_prob=local_log_prob)


# ----------------------------------------------------------------------------- MAPPO
@mutant("PPO-MAPPO-2", "PPO-MAPPO-3", doc="MAPPO batches merged without aligning every field: actor-side fields "
        "sorted by key, critic obs, advantage and return left in storage order.", source="002 §6, §12")
def mappo_unaligned(ref):
    def align_batch(batch):
        out = mappo.align_batch(batch)
        return {k: batch[k] if k in ("critic_obs", "advantage", "return") else v for k, v in out.items()}

    return override(ref, "ppo", align_batch=align_batch)


@mutant("PPO-MAPPO-4", doc="One agent's mask broadcast to every agent of the same (episode, timestep).",
        source="002 §6")
def mask_broadcast_across_agents(ref):
    def align_batch(batch):
        out = mappo.align_batch(batch)
        if "mask" in out:
            e, t = out["episode_id"], out["timestep"]
            first = torch.ones_like(e, dtype=torch.bool)
            first[1:] = (e[1:] != e[:-1]) | (t[1:] != t[:-1])
            leader = torch.cummax(torch.where(first, torch.arange(len(e)), torch.zeros_like(e)), 0).values
            out["mask"] = out["mask"][leader]
        return out

    return override(ref, "ppo", align_batch=align_batch)


@mutant("PPO-MAPPO-1", doc="The document's sample assertions: agent_id and timestep each checked for "
        "monotonicity on their own, which rejects a correctly sorted batch.", source="002 §6 (errata)")
def per_column_order_check(ref):
    def check_alignment(batch):
        for k in ("agent_id", "timestep"):
            if not bool((batch[k][:-1] <= batch[k][1:]).all()):
                raise ValueError(f"[PPO-MAPPO-1] {k} not sorted")

    return override(ref, "ppo", check_alignment=check_alignment)




# ----------------------------------------------------------------------------- clauses on points the seed document leaves open
@mutant("PPO-SELFTEST-1", doc="Self-test share counts |new - old| > 2, so drops are counted as jumps.")
def jump_share_uses_absolute_difference(ref):
    def log_ratio_excess(new_log_prob, old_log_prob, *, threshold=2.0):
        return ((new_log_prob - old_log_prob).abs() > threshold).to(new_log_prob.dtype).mean()

    return override(ref, "ppo", log_ratio_excess=log_ratio_excess)


@mutant("PPO-RATIO-2", doc="ratio.std as the population std (divides by B, not B - 1).")
def ratio_std_population(ref):
    def ratio_std(ratio):
        return ratio.std(correction=0) if ratio.numel() > 1 else ratio.new_zeros(())

    return override(ref, "ppo", ratio_std=ratio_std)


@mutant("PPO-SLO-6", doc="Entropy trend read from the first and last values only (noise decides the slope).")
def entropy_trend_endpoints(ref):
    def entropy_trend(entropy):
        h = entropy.detach().double()
        slope = float(h[-1] - h[0]) / (h.numel() - 1)
        a = float(h[0])
        return {"slope": slope, "intercept": a, "decreasing": slope < 0, "slow": -slope * (h.numel() - 1) < a}

    return override(ref, "ppo", entropy_trend=entropy_trend)


# ----------------------------------------------------------------------------- suite-strength classes
@mutant("PPO-DTYPE-1", "PPO-RATIO-1", doc="The ratio is computed in float32 whatever the log-probs' dtype.",
        source="a .float() before exp in a mixed-precision trainer")
def ratio_in_float32(ref):
    def ratio(new_log_prob, old_log_prob):
        return torch.exp(new_log_prob.float() - old_log_prob.detach().float())

    return override(ref, "ppo", ratio=ratio)


@mutant("PPO-GRAD-2", doc="The clipped policy loss keeps the advantage in the graph: the policy loss trains "
        "whatever computed the advantages (the critic).", source="GAE computed outside torch.no_grad()")
def policy_loss_grad_into_advantage(ref):
    def clipped_policy_loss(ratio, advantage, *, clip_eps):
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage
        return -torch.min(ratio * advantage, clipped).mean()

    return override(ref, "ppo", clipped_policy_loss=clipped_policy_loss)


@mutant("PPO-ADV-1", doc="Keyword not forwarded: advantage normalisation always uses eps = 1e-8 and no clamp.",
        source="a config field that never reaches the function")
def normalize_ignores_keywords(ref):
    base = ref.ppo.normalize_advantages

    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):
        return base(advantage)

    return override(ref, "ppo", normalize_advantages=normalize_advantages)


def _normalisation(ref, denominator):
    """The reference with ``normalize_advantages`` = (A − mean) / denominator(A, eps), then the clamp."""
    def normalize_advantages(advantage, *, eps=1e-8, clamp=None):
        out = (advantage - advantage.mean()) / denominator(advantage, eps)
        return out if clamp is None else out.clamp(-clamp, clamp)

    return override(ref, "ppo", normalize_advantages=normalize_advantages)


@mutant("PPO-ADV-1", doc="eps inside the square root: (A - mean) / sqrt(var + eps), a SHOULD formula the "
        "implementation provides and computes wrongly (it must fail the audit, not only a test).",
        source="a common normalisation written from memory")
def advantage_eps_inside_sqrt(ref):
    return _normalisation(ref, lambda a, eps: torch.sqrt(a.var() + eps))


@mutant("PPO-ADV-1", doc="Declares the population std (advantage_std ddof 0) and follows it in float64 only; the "
        "float32 path takes torch's Bessel .std() (a declaration honoured for one dtype).",
        source="a float32 fast path written with the tensor library's defaults")
def advantage_std_declared_float64_only(ref):
    impl = _normalisation(ref, lambda a, eps: a.std(unbiased=a.dtype != torch.float64) + eps)
    impl.capabilities = {**ref.capabilities, "conventions": {"advantage_std": {"ddof": 0, "eps": 1e-8, "eps_mode": "add"}}}
    return impl


class _NoZeroGrad:
    """An optimiser whose zero_grad does nothing: gradients pile up from step to step."""

    def __init__(self, opt):
        self._opt = opt

    def zero_grad(self, *a, **k):
        return None

    def __getattr__(self, name):
        return getattr(self._opt, name)


@mutant("PPO-UPDATE-4", doc="The update loop never zeroes the gradients: each step applies the sum of every "
        "earlier minibatch's gradient (invisible at step 1).", source="a zero_grad() moved outside the epoch loop")
def update_accumulates_gradients(ref):
    base = ref.ppo.ppo_update

    def ppo_update(actor, critic, optimizer, batch, **kw):
        return base(actor, critic, _NoZeroGrad(optimizer), batch, **kw)

    return override(ref, "ppo", ppo_update=ppo_update)


@mutant("PPO-UPDATE-4", doc="One shuffle reused for every epoch (the generator is re-seeded per epoch).",
        source="torch.manual_seed(seed) inside the epoch loop")
def update_reuses_one_shuffle(ref):
    base = ref.ppo.ppo_update

    def ppo_update(actor, critic, optimizer, batch, *, epochs, generator=None, **kw):
        state = (generator or torch.Generator()).get_state()
        records = []
        for e in range(epochs):
            g = torch.Generator()
            g.set_state(state)
            recs = base(actor, critic, optimizer, batch, epochs=1, generator=g, **kw)
            records += [{**r, "epoch": e} for r in recs]
            if recs and recs[-1]["early_stop"]:
                break
        return records

    return override(ref, "ppo", ppo_update=ppo_update)


# ----------------------------------------------------------------------------- GAE and the loss level
def _gae_with(ref, **changed):
    """The reference GAE with some of its flags replaced (a function of the original arguments)."""
    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        args = {"done": done, "truncated": truncated}
        args.update({k: f(done, truncated) for k, f in changed.items()})
        return ref.ppo.gae(reward, value, next_value, args["done"], gamma=gamma, lam=lam, truncated=args["truncated"])

    return gae


@mutant("PPO-GAE-1", doc="GAE ignores done: the bootstrap and the recursion both cross episode ends.",
        source="the trainers' GAE called without dones (a rollout buffer that drops them)")
def gae_ignores_done(ref):
    return override(ref, "ppo", gae=_gae_with(ref, done=lambda d, u: torch.zeros_like(d)))


@mutant("PPO-GAE-2", doc="Truncation handled as termination: no bootstrap from the state a time limit cut.",
        source="one done = terminated or truncated (the pre-gymnasium convention)")
def gae_truncation_as_termination(ref):
    def as_terminal(done, truncated):
        return done if truncated is None else done.bool() | truncated.bool()

    impl = override(ref, "ppo", gae=_gae_with(ref, done=as_terminal))
    impl.capabilities["terminated_truncated"] = True  # the clause is reached only with truncation declared
    return impl


@mutant("PPO-LOSSES-1", doc="loss_critic without vf_coef (the coefficient applied later by the caller).")
def losses_critic_without_coefficient(ref):
    def losses(actor, critic, batch, *, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01):
        return ref.ppo.losses(actor, critic, batch, clip_eps=clip_eps, vf_coef=1.0, ent_coef=ent_coef)

    return override(ref, "ppo", losses=losses)


@mutant("PPO-LOSSES-1", doc="loss_objective is the unclipped surrogate −mean(r·A).")
def losses_unclipped_objective(ref):
    def losses(actor, critic, batch, *, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01):
        out = dict(ref.ppo.losses(actor, critic, batch, clip_eps=clip_eps, vf_coef=vf_coef, ent_coef=ent_coef))
        new, _ = masking.evaluate_actions(actor(batch["obs"]), batch["mask"], batch["action"])
        out["loss_objective"] = -(torch.exp(new - batch["old_log_prob"].detach()) * batch["advantage"].detach()).mean()
        return out

    return override(ref, "ppo", losses=losses)


# ----------------------------------------------------------------------------- mechanisms past a threshold
@mutant("PPO-RATIO-1", doc="The log-ratio clamped at ±20 before exp: a ratio past e^20 comes back as e^20.",
        source="an overflow guard copied from an LM trainer")
def ratio_with_log_clamp(ref):
    def ratio(new_log_prob, old_log_prob):
        return torch.exp((new_log_prob - old_log_prob).clamp(-20.0, 20.0))

    return override(ref, "ppo", ratio=ratio)


@mutant("PPO-LOSS-1", doc="Dual-clip PPO left on (c = 3): for a negative advantage the loss is capped at -c·A, which "
        "changes it once the ratio passes 3.", source="dual-clip PPO (Ye et al., 2020) as a library default")
def dual_clip_left_on(ref):
    base = ref.ppo.clipped_policy_loss

    def clipped_policy_loss(ratio, advantage, *, clip_eps):
        per = torch.maximum(-ratio * advantage, -ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
        dual = torch.where(advantage < 0, torch.minimum(per, -3.0 * advantage), per)
        return dual.mean() + 0.0 * base(ratio, advantage, clip_eps=clip_eps)

    return override(ref, "ppo", clipped_policy_loss=clipped_policy_loss)


@mutant("PPO-UPDATE-4", doc="ppo_update ignores clip_eps, vf_coef and ent_coef: the loss keeps 0.2, 0.5 and 0.01.",
        source="keywords accepted by the update but not passed to the minibatch loss")
def ppo_update_ignores_loss_coefficients(ref):
    return deaf_to(ref, "ppo", "ppo_update", clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)


@mutant("PPO-MASK-1", doc="The masked distribution fills illegal logits with -1e4: legal logits far below it "
        "(-3e4) give the illegal action all the mass.", source="a hand-written 'very negative' fill")
def distribution_fill_minus_1e4(ref):
    def masked_distribution(logits, mask):
        return Categorical(logits=logits.masked_fill(~mask, -1e4))

    return override(ref, "ppo", masked_distribution=masked_distribution)


@mutant("PPO-SLO-4", doc="The entropy ratio divides by log of the whole action count, not of each row's legal "
        "count: a policy uniform on its legal sets reads below 1, so the stuck-entropy gate passes it.",
        source="log(num_actions) taken from the logits' width")
def entropy_ratio_over_all_actions(ref):
    def entropy_ratio(entropy, mask):
        width = torch.log(torch.tensor(float(mask.shape[-1]), dtype=entropy.dtype, device=entropy.device))
        return entropy.sum() / (width * entropy.shape[0])

    return override(ref, "ppo", entropy_ratio=entropy_ratio)


@mutant("PPO-LOGP-1", "PPO-ENT-1", doc="evaluate_actions squeezes its outputs: a batch of one row returns 0-d "
        "tensors instead of [1].", source=".squeeze() to drop a trailing axis, which drops the batch axis of B = 1")
def evaluate_actions_squeezed(ref):
    base = ref.ppo.evaluate_actions

    def evaluate_actions(logits, mask, action):
        log_prob, entropy = base(logits, mask, action)
        return log_prob.squeeze(), entropy.squeeze()

    return override(ref, "ppo", evaluate_actions=evaluate_actions)


@mutant("PPO-GAE-1", doc="GAE reads done with a bool-only ~done: 0/1 float flags, which the contract allows, "
        "fail or flip.", source="(~done).float() written for bool flags")
def gae_bool_only_flags(ref):
    base = ref.ppo.gae

    def gae(reward, value, next_value, done, *, gamma, lam, truncated=None):
        keep = ~done  # a float tensor has no ~
        return base(reward, value, next_value, ~keep, gamma=gamma, lam=lam, truncated=truncated)

    return override(ref, "ppo", gae=gae)


@mutant("PPO-SLO-6", doc="The entropy trend's decline counts U steps of the fitted line over U updates, not U - 1.",
        source="-slope * len(h) for the fall of the line over the run")
def entropy_trend_u_steps(ref):
    base = ref.ppo.entropy_trend

    def entropy_trend(entropy):
        out = dict(base(entropy))
        out["slow"] = -out["slope"] * entropy.numel() < out["intercept"]
        return out

    return override(ref, "ppo", entropy_trend=entropy_trend)


@mutant("PPO-REMAP-1", doc="local_sample ignores its generator and draws from the global stream: a seeded rollout "
        "cannot be replayed.", source="torch.multinomial without generator=")
def local_sample_ignores_its_generator(ref):
    return deaf_to(ref, "ppo", "local_sample", generator=None)

