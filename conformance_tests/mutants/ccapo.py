"""Mutants of the ccapo family: CCAPO v4.0's rules (seed 004 §8) and slips the v4.1 document guards against."""
from __future__ import annotations

import copy

import torch

from conformance_tests.mutants import deaf_to, mutant, override
from reference_impl.ccapo.update import make_ccapo_update


@mutant("CCAPO-I-1", "CCAPO-STDB-5", doc="v4.0's marginal importance I(E) = N_succ(E)/(N_succ_total + eps) in the STDB lookup.",
        source="004 §3.2.1, §8")
def v40_marginal_importance(ref):
    c = ref.ccapo

    def score_steps(stats, anchors, fingerprints, *, alpha_smooth=1.0, distance_exponent=0.5, lam=1.0, eps=1e-8):
        out = c.score_steps(stats, anchors, fingerprints, alpha_smooth=alpha_smooth,
                            distance_exponent=distance_exponent, lam=lam, eps=eps)
        keys = [(*a, f) for a, f in zip(anchors, fingerprints)]
        q = torch.zeros(len(keys), dtype=torch.float64)
        for t, k in enumerate(keys):
            if k in stats["edges"]:
                e = stats["edges"][k]
                ns, nt = torch.tensor([float(e["n_succ"])]), torch.tensor([float(e["n_total"])])
                i = ns.double() / (stats["n_succ_total"] + eps)
                cc = c.criticality(ns, nt, float(stats["n_succ_total"]), float(stats["n_total_global"]), eps=eps)
                dg = e["d_sum"] / e["n_succ"] if e["n_succ"] else 0.0
                d = c.distance_decay(torch.tensor([dg], dtype=torch.float64), distance_exponent=distance_exponent)
                q[t] = c.q_stdb(i, cc, d, lam=lam)[0]
        return {**out, "q": q}

    return override(ref, "ccapo", score_steps=score_steps)


@mutant("CCAPO-MICRO-3", doc="v4.0: the micro stream z-scored with std + eps, no sigma_min floor.", source="004 §5.2.3, §8")
def no_sigma_min_floor(ref):
    def micro_advantage(raw, *, sigma_min=0.1, valid=None):
        m = torch.ones_like(raw, dtype=torch.bool) if valid is None else valid
        v = raw[m]
        z = (raw - v.mean()) / (v.std(unbiased=False) + 1e-8)
        return torch.where(m, z, torch.zeros_like(z))

    return override(ref, "ccapo", micro_advantage=micro_advantage)


@mutant("CCAPO-R-1", "CCAPO-R-2", doc="v4.0's time penalty R_penalty = -0.05.", source="004 §4.1, §8")
def v40_step_penalty(ref):
    base = ref.ccapo.macro_return

    def macro_return(success, n_steps, *, r_terminal=10.0, r_penalty=-0.05):
        return base(success, n_steps, r_terminal=r_terminal, r_penalty=r_penalty)

    return override(ref, "ccapo", macro_return=macro_return)


@mutant("CCAPO-STDB-1", doc="v4.0: failed trajectories are ignored, so N_total only grows on success.", source="004 §7.2, §8")
def n_total_only_on_success(ref):
    base = ref.ccapo.stdb_update

    def stdb_update(stats, trajectory, **kw):
        return base(stats, trajectory, **kw) if trajectory["success"] else copy.deepcopy(dict(stats))

    return override(ref, "ccapo", stdb_update=stdb_update)


@mutant("CCAPO-STDB-2", doc="N_succ incremented by failed trajectories too.", source="004 §7.2")
def n_succ_on_failure(ref):
    base = ref.ccapo.stdb_update

    def stdb_update(stats, trajectory, **kw):
        new = base(stats, trajectory, **kw)
        if not trajectory["success"]:
            for a, f in dict.fromkeys(zip(map(tuple, trajectory["anchors"]), trajectory["fingerprints"])):
                e = new["edges"][(*a, f)]
                new["edges"][(*a, f)] = {**e, "n_succ": e["n_succ"] + 1}
        return new

    return override(ref, "ccapo", stdb_update=stdb_update)


@mutant("CCAPO-STDB-3", doc="V-bar moved toward the edge scores by failed trajectories as well.", source="004 §7.2, §7.3")
def v_bar_on_failure(ref):
    base = ref.ccapo.stdb_update

    def stdb_update(stats, trajectory, **kw):
        new = base(stats, trajectory, **kw)
        if not trajectory["success"]:
            as_success = base(stats, {**trajectory, "success": True}, **kw)
            new["anchors"] = as_success["anchors"]
        return new

    return override(ref, "ccapo", stdb_update=stdb_update)


@mutant("CCAPO-LOOP-1", "CCAPO-LOOP-2", doc="A loop filter that catches A→B→A but misses A→A.", source="004 §7.1")
def loop_filter_misses_self_loop(ref):
    def loop_mask(fingerprint_ids):
        f = torch.as_tensor(fingerprint_ids)
        out = torch.zeros(f.shape, dtype=torch.bool)
        if f.shape[-1] >= 3:
            out[..., 2:] = f[..., 2:] == f[..., :-2]
        return out

    return override(ref, "ccapo", loop_mask=loop_mask)


@mutant("CCAPO-MACRO-2", doc="Sample std (ddof=1) in the group z-score: a one-trajectory group gives NaN.", source="004 §5.1")
def sample_std_macro(ref):
    def macro_advantage(returns, *, eps=1e-8):
        return (returns - returns.mean(-1, keepdim=True)) / (returns.std(-1, keepdim=True) + eps)

    return override(ref, "ccapo", macro_advantage=macro_advantage)


@mutant("CCAPO-PPO-1", doc="Token-level mean over the batch instead of (1/T) per trajectory then the mean.", source="004 §6")
def token_mean_objective(ref):
    base = ref.ccapo.policy_loss

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        # re-weight each trajectory by its length so the per-trajectory mean becomes a token mean
        T = mask.sum(-1, keepdim=True).to(advantages.dtype)
        w = T * mask.any(-1).sum() / T.sum()
        return base(logp_new, logp_old, logp_ref, advantages * w, mask, clip_eps=clip_eps, beta_kl=beta_kl)

    return override(ref, "ccapo", policy_loss=policy_loss)


@mutant("CCAPO-MICRO-2", doc="An unseen anchor compared against V-bar = 0 instead of giving no micro signal.", source="004 §5.2.2")
def unseen_anchor_not_zero(ref):
    def micro_raw_advantage(r_micro, v_bar, anchor_seen):
        return r_micro - v_bar

    return override(ref, "ccapo", micro_raw_advantage=micro_raw_advantage)


# ----------------------------------------------------------------------------- suite-strength classes
@mutant("CCAPO-PPO-1", doc="Keyword not forwarded: the objective always uses beta_kl = 0.04 and clip_eps = 0.2.",
        source="a trainer config whose KL coefficient never reaches the loss")
def objective_ignores_keywords(ref):
    base = ref.ccapo.policy_loss

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        return base(logp_new, logp_old, logp_ref, advantages, mask)

    return override(ref, "ccapo", policy_loss=policy_loss)


@mutant("CCAPO-PPO-2", doc="The KL term is taken against a reference log-prob left in the graph: gradient "
        "reaches logp_ref.", source="a reference model run without torch.no_grad()")
def kl_gradient_into_reference(ref):
    base = ref.ccapo.policy_loss

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        out = base(logp_new, logp_old, logp_ref, advantages, mask, clip_eps=clip_eps, beta_kl=beta_kl)
        m = mask.to(logp_ref.dtype)
        leak = ((logp_ref - logp_ref.detach()) * m).sum()  # zero in value, but not in gradient
        return {**out, "loss": out["loss"] + leak}

    return override(ref, "ccapo", policy_loss=policy_loss)


@mutant("CCAPO-UPDATE-1", doc="Gradients accumulate across minibatches: the update loop never zeroes them.",
        source="004 §6; an optimizer.zero_grad() dropped from the loop")
def gradients_accumulated_across_minibatches(ref):
    def step(optimizer, loss, params, max_grad_norm):
        loss.backward()  # onto whatever the previous minibatches left in .grad
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        return norm

    return override(ref, "ccapo", ccapo_update=make_ccapo_update(step=step))


@mutant("CCAPO-UPDATE-1", doc="The KL term is taken to the sampling (old) policy instead of the reference policy.",
        source="004 §6: D_KL(π_θ‖π_ref), not ‖π_old")
def kl_against_old_policy(ref):
    def objective(logp_new, mb, *, clip_eps, beta_kl):
        return ref.ccapo.policy_loss(logp_new, mb["logp_old"], mb["logp_old"], mb["advantage"], mb["mask"],
                                     clip_eps=clip_eps, beta_kl=beta_kl)

    return override(ref, "ccapo", ccapo_update=make_ccapo_update(objective=objective))


@mutant("CCAPO-STDB-1", doc="A shallow copy of the state: the update's edge records are written into the caller's "
        "own edge table, so the state it was given changes too.", source="dict(stats) without copying stats['edges']")
def stdb_update_writes_through_a_shallow_copy(ref):
    base = ref.ccapo.stdb_update

    def stdb_update(stats, trajectory, **kw):
        new = base(stats, trajectory, **kw)
        stats["edges"].update(new["edges"])
        return new

    return override(ref, "ccapo", stdb_update=stdb_update)


@mutant("CCAPO-DTYPE-1", doc="The macro return cast back to the dtype of its step counts: with int64 counts "
        "R_tau is truncated (9.7 becomes 9).", source="out.to(n_steps.dtype), to keep the caller's dtype")
def macro_return_in_the_counts_dtype(ref):
    base = ref.ccapo.macro_return

    def macro_return(success, n_steps, *, r_terminal=10.0, r_penalty=-0.1):
        return base(success, n_steps, r_terminal=r_terminal, r_penalty=r_penalty).to(n_steps.dtype)

    return override(ref, "ccapo", macro_return=macro_return)


@mutant("CCAPO-MACRO-1", doc="The group z-score follows the seed's population std in float64 only; the float32 "
        "path takes torch's default Bessel .std() (a convention honoured for one dtype).",
        source="a float32 fast path written with the tensor library's defaults")
def macro_advantage_bessel_in_float32(ref):
    base = ref.ccapo.macro_advantage

    def macro_advantage(returns, *, eps=1e-8):
        if returns.dtype == torch.float64:
            return base(returns, eps=eps)
        centred = returns - returns.mean(-1, keepdim=True)
        return centred / (returns.std(-1, keepdim=True) + eps)

    return override(ref, "ccapo", macro_advantage=macro_advantage)


@mutant("CCAPO-UPDATE-1", doc="ccapo_update ignores clip_eps: every minibatch clips at the default 0.2.",
        source="a keyword accepted by the update but not passed to the objective")
def ccapo_update_ignores_clip_eps(ref):
    return deaf_to(ref, "ccapo", "ccapo_update", clip_eps=0.2)


@mutant("CCAPO-PPO-1", doc="The clip fraction and approx_kl diagnostics average over every [B, T] entry, padding "
        "included, while the loss is over real steps.", source="a diagnostic written as .mean() over the full tensor")
def diagnostics_over_padding(ref):
    base = ref.ccapo.policy_loss

    def policy_loss(logp_new, logp_old, logp_ref, advantage, mask, **kw):
        out = dict(base(logp_new, logp_old, logp_ref, advantage, mask, **kw))
        log_ratio = (logp_new - logp_old).detach()
        ratio = log_ratio.exp()
        out["approx_kl"] = ((ratio - 1.0) - log_ratio).mean()
        out["clip_fraction"] = ((ratio - 1.0).abs() > kw.get("clip_eps", 0.2)).to(ratio.dtype).mean()
        return out

    return override(ref, "ccapo", policy_loss=policy_loss)


@mutant("CCAPO-STDB-3", "CCAPO-STDB-5", doc="The STDB fold and the step scoring score edges with the document's "
        "alpha_smooth, distance exponent, lambda and eps whatever they are passed.",
        source="a scoring helper called without the caller's keywords")
def stdb_scoring_ignores_its_keywords(ref):
    forced = dict(alpha_smooth=1.0, distance_exponent=0.5, lam=1.0, eps=1e-8)
    return deaf_to(deaf_to(ref, "ccapo", "stdb_update", **forced), "ccapo", "score_steps", **forced)



@mutant("CCAPO-PPO-1", doc="The ratio as exp(logp_new)/exp(logp_old): 0/0 = NaN once a multi-token action's "
        "log-probability falls below about -745.", source="a ratio written as a quotient of probabilities")
def ratio_as_a_quotient_of_probabilities(ref):
    base = ref.ccapo.policy_loss

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        out = dict(base(logp_new, logp_old, logp_ref, advantages, mask, clip_eps=clip_eps, beta_kl=beta_kl))
        m = torch.as_tensor(mask)
        rho, adv = logp_new.exp() / logp_old.detach().exp(), advantages.detach()
        unclipped, clipped = rho * adv, rho.clamp(1 - clip_eps, 1 + clip_eps) * adv
        surr = torch.where(m, torch.where(unclipped <= clipped, unclipped, clipped), torch.zeros_like(adv))
        rows = m.any(-1)
        objective = (surr.sum(-1)[rows] / m.sum(-1)[rows]).mean()
        out.update(loss_clip=-objective, loss=-objective + out["loss_kl"])
        return out

    return override(ref, "ccapo", policy_loss=policy_loss)


@mutant("CCAPO-STDB-5", doc="V-bar looked up by location alone: anchors sharing a room share (the first one's) "
        "baseline, and an unseen anchor in a known room counts as seen.")
def v_bar_by_location(ref):
    def score_steps(stats, anchors, fingerprints, **kw):
        out = dict(ref.ccapo.score_steps(stats, anchors, fingerprints, **kw))
        by_loc = {}
        for (loc, _), rec in stats["anchors"].items():
            by_loc.setdefault(loc, float(rec["v_bar"]))
        out["anchor_seen"] = torch.tensor([a[0] in by_loc for a in anchors], dtype=torch.bool)
        out["v_bar"] = torch.tensor([by_loc.get(a[0], 0.0) for a in anchors], dtype=torch.float64)
        return out

    return override(ref, "ccapo", score_steps=score_steps)


@mutant("CCAPO-STDB-5", doc="An anchor counts as seen only with the edge taken from it stored: a new "
        "choice from a known situation gets A_raw = 0 instead of -V-bar.")
def anchor_seen_needs_the_edge(ref):
    def score_steps(stats, anchors, fingerprints, **kw):
        out = dict(ref.ccapo.score_steps(stats, anchors, fingerprints, **kw))
        seen = out["anchor_seen"] & out["edge_seen"]
        out.update(anchor_seen=seen, v_bar=torch.where(seen, out["v_bar"], torch.zeros_like(out["v_bar"])))
        return out

    return override(ref, "ccapo", score_steps=score_steps)


@mutant("CCAPO-UPDATE-1", doc="ccapo_update ignores its generator: the shuffle comes from the global RNG, so a run "
        "cannot be replayed.", source="a randperm without generator=")
def ccapo_update_ignores_its_generator(ref):
    return deaf_to(ref, "ccapo", "ccapo_update", generator=None)


@mutant("CCAPO-ANCHOR-1", doc="The web location keeps the URL's netloc: a port or a login splits one host into "
        "several locations.", source="urlsplit(url).netloc in place of .hostname")
def web_location_keeps_the_netloc(ref):
    from urllib.parse import urlsplit

    def abstract_location(raw_location, *, domain):
        out = ref.ccapo.abstract_location(raw_location, domain=domain)
        if domain != "web":
            return out
        u = urlsplit(raw_location if "//" in raw_location else "//" + raw_location)
        return u.netloc + out[len(u.hostname or ""):]

    return override(ref, "ccapo", abstract_location=abstract_location)


@mutant("CCAPO-STDB-1", doc="A trajectory without steps is skipped: N_total_global misses it, and every C(E) "
        "with it.", source="an early return on an empty trajectory")
def stdb_update_skips_empty_trajectories(ref):
    def stdb_update(stats, trajectory, **kw):
        if len(trajectory["fingerprints"]) == 0:
            return copy.deepcopy(dict(stats))
        return ref.ccapo.stdb_update(stats, trajectory, **kw)

    return override(ref, "ccapo", stdb_update=stdb_update)
