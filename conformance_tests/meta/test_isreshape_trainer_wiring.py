"""Wiring tests of the two IS-Reshape v4 trainers: what reaches the update is what was sampled.

The smoke tests only show that the trainers run, log and resume; a trainer that hands the loss the wrong
behaviour log-probs, a shifted response mask, a neighbour's reward or a batch-wide baseline passes them
all, and so does one whose gradient never reaches the optimiser. Here each trainer runs for a few updates
on a tiny configuration while ``monkeypatch`` spies on its boundaries -- the sampler (``torch.multinomial``
and, for the LM, ``generate``), the reward function, the scoring forward pass, the loss entry point
(``objective`` / ``arm_loss``) and every optimiser step (a global pre-step hook that sees the parameters
and the gradients the step is about to apply). The tests then recompute, with formulas written here from
the spec and from parameters recorded before each step, what each sample must carry:

* the bandit (``reference_impl/isreshape/trainer.py``): tokens drawn from the stale epsilon-mixed behaviour
  policy mu, log mu of exactly those tokens handed to the loss, the reward the reward function gave each
  sample, the group-mean baseline over the samples of one context, the gradient the optimiser applies
  (ISR-LOSS-2 chained through the softmax table), and the proximal policy of ``ppo-decoupled``;
* the LM (``reference_impl/isreshape/lm/trainer.py``): the update scores the generated tokens, log mu is the
  sampling distribution of the lagged behaviour weights, the response mask is exactly the generated tokens
  up to and including the first eos, rewards and GRPO z-scores stay with their samples and their prompt's
  group, the KL reference is the frozen initial model, and the optimiser receives the gradient of the v4
  loss plus the k3 KL on the sampled batch (after the grad-norm clip).
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from conformance_tests.harness import assert_that

pytestmark = pytest.mark.meta


# ----------------------------------------------------------------------------- shared spies
def _spy_steps(log: list, params_of):
    """Record, before every optimiser step, the parameters and gradients it is about to use (by name).
    The hook is global: the caller removes it (``handle.remove()``) when its run ends."""
    def pre_step(opt, args, kwargs):
        named = params_of(opt)
        log.append({"params": {k: p.detach().clone() for k, p in named.items()},
                    "grads": {k: None if p.grad is None else p.grad.detach().clone() for k, p in named.items()}})
    return register_optimizer_step_pre_hook(pre_step)


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference (inf on a shape mismatch), for messages and thresholds."""
    if a.shape != b.shape:
        return math.inf
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


# ============================================================================= the token bandit
BANDIT = dict(contexts=4, tokens=6, batch_contexts=4, group_size=4, epochs=2, lr=0.3, behaviour_lag=2,
              behaviour_eps=0.2, tau=1.5, beta=2.0, gamma_min=0.1, gamma_max=0.9, dtype="float64",
              checkpoint_every=100, seed=3)
BANDIT_UPDATES = 4  # mu is refreshed at updates 0 and 2, so updates 1 and 3 sample from a stale mu


def _record_bandit(out, **overrides) -> dict:
    """Run the bandit trainer and record the sampler, the reward function, the loss inputs and every step."""
    from reference_impl.isreshape import trainer as tr

    rec = {"draws": [], "rewards": [], "losses": [], "steps": []}
    real_objective, real_rewards, real_multinomial = tr.objective, tr.TokenBandit.rewards, torch.multinomial

    def multinomial(probs, num_samples, *args, **kwargs):
        out_ = real_multinomial(probs, num_samples, *args, **kwargs)
        rec["draws"].append({"probs": probs.detach().clone(), "tok": out_.detach().clone().squeeze(-1)})
        return out_

    def rewards(self, ctx, tok, gen):
        r = real_rewards(self, ctx, tok, gen)
        rec["rewards"].append({"ctx": ctx.clone(), "tok": tok.clone(), "reward": r.clone()})
        return r

    def objective(cfg, log_prob, ref_log_prob, adv, mask, prox_log_prob=None):
        rec["losses"].append({"lp": log_prob.detach().clone(), "lp_mu": ref_log_prob.detach().clone(),
                              "adv": adv.detach().clone(), "mask": mask.detach().clone(),
                              "prox": None if prox_log_prob is None else prox_log_prob.detach().clone()})
        return real_objective(cfg, log_prob, ref_log_prob, adv, mask, prox_log_prob)

    cfg = tr.IsReshapeConfig(**{**BANDIT, **overrides})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "multinomial", multinomial)
        mp.setattr(tr.TokenBandit, "rewards", rewards)
        mp.setattr(tr, "objective", objective)
        handle = _spy_steps(rec["steps"], lambda opt: {"logits": opt.param_groups[0]["params"][0]})
        try:
            tr.train(cfg, out=out, updates=BANDIT_UPDATES)
        finally:
            handle.remove()
    rec["cfg"] = cfg
    return rec


def _behaviour_mix(logits: torch.Tensor, eps: float) -> torch.Tensor:
    """mu = (1 - eps) softmax(theta_stale) + eps / K, written out (the trainer's docstring and config)."""
    e = torch.exp(logits - logits.max(-1, keepdim=True).values)
    return (1.0 - eps) * e / e.sum(-1, keepdim=True) + eps / logits.shape[-1]


def _bandit_updates(rec) -> list[dict]:
    """Per update: sampled contexts/tokens/rewards, the loss inputs and the steps of each epoch, and the
    oracle behaviour table (mu of the parameters at the last refresh, update - update % lag)."""
    cfg, e = rec["cfg"], rec["cfg"].epochs
    n = BANDIT_UPDATES
    counts = [len(rec[k]) for k in ("draws", "rewards", "losses", "steps")]
    assert_that(counts == [n, n, n * e, n * e], "ISR-LOSS-2", counts,
                f"{BANDIT_UPDATES} draws and reward calls, {BANDIT_UPDATES * e} loss calls and optimiser steps")
    out = []
    for u in range(BANDIT_UPDATES):
        theta_start = rec["steps"][u * e]["params"]["logits"]  # nothing has stepped on this batch yet
        stale = u - u % cfg.behaviour_lag
        mu = _behaviour_mix(rec["steps"][stale * e]["params"]["logits"], cfg.behaviour_eps)
        out.append({**rec["rewards"][u], "draw": rec["draws"][u], "mu": mu, "theta_start": theta_start,
                    "losses": rec["losses"][u * e:(u + 1) * e], "steps": rec["steps"][u * e:(u + 1) * e]})
    return out


def _log_pi(theta: torch.Tensor, ctx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """log softmax(theta[ctx])[tok] of the tabular policy, written out."""
    return theta[ctx, tok] - torch.logsumexp(theta[ctx], -1)


@pytest.fixture(scope="module")
def bandit_v4(tmp_path_factory):
    return _record_bandit(tmp_path_factory.mktemp("bandit") / "v4", loss="v4")


@pytest.mark.clause("ISR-RATIO-1", "ISR-LOSS-2")
def test_bandit_update_gets_the_sampled_tokens_and_their_stale_behaviour_log_prob(bandit_v4):
    """Tokens come from the stale mu, the reward function sees them, and the loss gets log mu and log pi of
    exactly those (context, token) pairs: log mu of the refresh's parameters, log pi of the current ones."""
    cfg = bandit_v4["cfg"]
    moved = 0.0
    for u, b in enumerate(_bandit_updates(bandit_v4)):
        ctx, tok = b["ctx"], b["tok"]
        err = _close(b["draw"]["probs"], b["mu"][ctx])
        assert_that(err < 1e-12, "ISR-RATIO-1", err, f"update {u}: tokens drawn from mu of the last refresh")
        assert_that(torch.equal(b["draw"]["tok"], tok), "ISR-RATIO-1", tok, f"update {u}: rewarded tokens = drawn")
        want_mu = torch.log(b["mu"][ctx, tok])
        moved = max(moved, _close(want_mu, _log_pi(b["theta_start"], ctx, tok)))
        for e, (loss, step) in enumerate(zip(b["losses"], b["steps"])):
            err = _close(loss["lp_mu"], want_mu)
            assert_that(err < 1e-12, "ISR-RATIO-1", err, f"update {u} epoch {e}: log mu of the sampled tokens")
            err = _close(loss["lp"], _log_pi(step["params"]["logits"], ctx, tok))
            assert_that(err < 1e-12, "ISR-LOSS-2", err, f"update {u} epoch {e}: log pi of the sampled tokens")
            assert_that(bool((loss["mask"] == 1).all()) and loss["mask"].shape == tok.shape, "ISR-LOSS-2",
                        loss["mask"], "every sample in the mask")
    # teeth: somewhere mu is really stale, so "log mu = log pi now" would be caught
    assert_that(moved > 1e-2, "ISR-RATIO-1", moved, f"a stale mu (lag {cfg.behaviour_lag}) that differs from pi")


@pytest.mark.clause("ISR-LOSS-2")
def test_bandit_rewards_and_group_mean_baseline_stay_with_their_samples(bandit_v4):
    """A = r - mean of the group, the group being the group_size samples of one drawn context, r the reward
    the reward function returned for that very sample."""
    g = bandit_v4["cfg"].group_size
    batch_wide = 0.0
    for u, b in enumerate(_bandit_updates(bandit_v4)):
        ctx, r = b["ctx"].view(-1, g), b["reward"].view(-1, g)
        assert_that(bool((ctx == ctx[:, :1]).all()), "ISR-LOSS-2", ctx, f"update {u}: a group is one context")
        want = (r - r.sum(-1, keepdim=True) / g).reshape(-1)
        batch_wide = max(batch_wide, _close(want, b["reward"] - b["reward"].mean()))
        for e, loss in enumerate(b["losses"]):
            err = _close(loss["adv"], want)
            assert_that(err < 1e-12, "ISR-LOSS-2", err, f"update {u} epoch {e}: A = r - group mean, per sample")
    assert_that(batch_wide > 1e-3, "ISR-LOSS-2", batch_wide, "group means that differ from the batch mean (teeth)")


def _v4_weight(r, adv, cfg):
    """w = (1 - gamma) + gamma r sech^2(tau (r - 1) / 2), gamma = gmin + (gmax - gmin) sigmoid(beta |A|)."""
    gamma = cfg.gamma_min + (cfg.gamma_max - cfg.gamma_min) / (1.0 + torch.exp(-cfg.beta * adv.abs()))
    return (1.0 - gamma) + gamma * r / torch.cosh(cfg.tau * (r - 1.0) / 2.0) ** 2


@pytest.mark.clause("ISR-LOSS-1", "ISR-LOSS-2")
def test_bandit_optimiser_applies_the_v4_gradient_of_the_sampled_batch(bandit_v4):
    """dL/dlog pi_t = -w_t A_t / (n + 1e-8) (ISR-LOSS-2), chained through log_softmax of the table:
    dL/dtheta[c] = sum_{t: ctx_t = c} dL/dlog pi_t (onehot(tok_t) - pi(.|c)). Every input is the oracle's own
    (sampled tokens, mu of the refresh, rewards), so a zero, detached or misrouted gradient fails."""
    cfg, largest = bandit_v4["cfg"], 0.0
    for u, b in enumerate(_bandit_updates(bandit_v4)):
        ctx, tok, rew = b["ctx"], b["tok"], b["reward"]
        g = cfg.group_size
        adv = (rew.view(-1, g) - rew.view(-1, g).mean(-1, keepdim=True)).reshape(-1)
        log_mu = torch.log(b["mu"][ctx, tok])
        for e, step in enumerate(b["steps"]):
            theta, grad = step["params"]["logits"], step["grads"]["logits"]
            assert_that(grad is not None, "ISR-LOSS-2", None, f"update {u} epoch {e}: a gradient on the table")
            lp = _log_pi(theta, ctx, tok)
            r = torch.exp((lp - log_mu).clamp(-20, 20))
            d_lp = -_v4_weight(r, adv, cfg) * adv / (len(tok) + 1e-8)
            pi = torch.softmax(theta, -1)
            want = torch.zeros_like(theta)
            for t in range(len(tok)):
                want[ctx[t]] -= d_lp[t] * pi[ctx[t]]
                want[ctx[t], tok[t]] += d_lp[t]
            err = _close(grad, want)
            assert_that(err < 1e-12, "ISR-LOSS-2", err,
                        f"update {u} epoch {e}: the table's gradient is the v4 gradient of this batch")
            largest = max(largest, float(want.abs().max()))
    assert_that(largest > 1e-3, "ISR-LOSS-2", largest, "a non-zero expected gradient somewhere (teeth)")


@pytest.mark.clause("PPO-LOSS-1")
def test_bandit_decoupled_ppo_proximal_policy_is_the_policy_before_the_first_step(tmp_path):
    """ppo-decoupled clips around pi_prox: log pi of the sampled tokens at the parameters the update started
    from, the same on every epoch (not the moving policy, not mu)."""
    rec = _record_bandit(tmp_path / "dec", loss="ppo-decoupled")
    apart = 0.0
    for u, b in enumerate(_bandit_updates(rec)):
        want = _log_pi(b["theta_start"], b["ctx"], b["tok"])
        for e, loss in enumerate(b["losses"]):
            assert_that(loss["prox"] is not None, "PPO-LOSS-1", None, "a proximal log-prob")
            err = _close(loss["prox"], want)
            assert_that(err < 1e-12, "PPO-LOSS-1", err, f"update {u} epoch {e}: pi_prox = pi at the update's start")
            apart = max(apart, _close(loss["lp"], want), _close(loss["lp_mu"], want))
    assert_that(apart > 1e-2, "PPO-LOSS-1", apart, "pi and mu differ from pi_prox somewhere (teeth)")


# ============================================================================= the causal LM
LM = dict(max_operand=6, hidden=16, layers=1, heads=2, pretrain_steps=100, batch_prompts=4, group_size=4,
          max_new_tokens=3, temperature=0.8, behaviour_lag=1, epochs=2, lr=5e-3, sample_dtype="float32",
          kl_coef=0.1, tau=1.5, beta=2.0, gamma_min=0.1, gamma_max=0.9, max_grad_norm=0.5, eval_every=100,
          checkpoint_every=100, seed=1)
LM_UPDATES = 3  # with lag 1: mu is theta_0, theta_0, theta_1; the reference stays theta_0 throughout


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """One recorded run of the v4 arm (the tiny init is pre-trained once, into the fixture's tmp dir)."""
    pytest.importorskip("transformers")
    from reference_impl.isreshape.lm.trainer import LmConfig, init_path

    cfg = LmConfig(**LM)
    root = tmp_path_factory.mktemp("lm")
    init = init_path(cfg, root)
    return _record_lm(cfg, init, root / "run")


def _record_lm(cfg, init: str, out) -> dict:
    from reference_impl.isreshape.lm import model as lm_mod
    from reference_impl.isreshape.lm import task as task_mod
    from reference_impl.isreshape.lm import trainer as tr

    rec = {"samples": [], "rewards": [], "scored": [], "losses": [], "steps": [], "cfg": cfg, "init": init}
    state: dict = {"draws": None}
    real = dict(load=lm_mod.load, generate=lm_mod.generate, logits=lm_mod.response_logits,
                match=task_mod.exact_match, loss=tr.arm_loss, multinomial=torch.multinomial)

    def load(*args, **kwargs):
        model, tok = real["load"](*args, **kwargs)
        state.setdefault("policy", model)
        return model, tok

    def multinomial(probs, num_samples, *args, **kwargs):
        out_ = real["multinomial"](probs, num_samples, *args, **kwargs)
        if state["draws"] is not None:
            state["draws"].append({"probs": probs.detach().clone(), "tok": out_.detach().clone().squeeze(-1)})
        return out_

    def generate(model, prompt_ids, prompt_mask, **kwargs):
        if kwargs.get("greedy"):  # the held-out evaluation: not a rollout
            return real["generate"](model, prompt_ids, prompt_mask, **kwargs)
        state["draws"] = []
        resp, lp_mu, mask = real["generate"](model, prompt_ids, prompt_mask, **kwargs)
        rec["samples"].append({"prompt_ids": prompt_ids.clone(), "prompt_mask": prompt_mask.clone(),
                               "resp": resp.clone(), "lp_mu": lp_mu.clone(), "mask": mask.clone(),
                               "draws": state["draws"], "eos": kwargs["eos_id"], "pad": kwargs["pad_id"]})
        state["draws"], state["pending"] = None, True
        return resp, lp_mu, mask

    def exact_match(resp, target):
        r = real["match"](resp, target)
        if state.pop("pending", False):
            rec["rewards"].append({"resp": resp.clone(), "target": target.clone(), "reward": r.clone()})
        return r

    def response_logits(model, prompt_ids, prompt_mask, resp):
        rec["scored"].append({"prompt_ids": prompt_ids.clone(), "prompt_mask": prompt_mask.clone(),
                              "resp": resp.clone()})
        return real["logits"](model, prompt_ids, prompt_mask, resp)

    def arm_loss(cfg_, lp, lp_mu, lp_ref, adv, mask, reward):
        rec["losses"].append({k: v.detach().clone() for k, v in
                              dict(lp=lp, lp_mu=lp_mu, lp_ref=lp_ref, adv=adv, mask=mask, reward=reward).items()})
        return real["loss"](cfg_, lp, lp_mu, lp_ref, adv, mask, reward)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lm_mod, "load", load)
        mp.setattr(lm_mod, "generate", generate)
        mp.setattr(lm_mod, "response_logits", response_logits)
        mp.setattr(task_mod, "exact_match", exact_match)
        mp.setattr(tr, "arm_loss", arm_loss)
        mp.setattr(torch, "multinomial", multinomial)
        handle = _spy_steps(rec["steps"], lambda opt: dict(state["policy"].named_parameters()))
        try:
            tr.train(cfg, out=out, updates=LM_UPDATES, model_path=init)
        finally:
            handle.remove()
    e = cfg.epochs
    counts = [len(rec[k]) for k in ("samples", "rewards", "scored", "losses", "steps")]
    assert_that(counts == [LM_UPDATES, LM_UPDATES, LM_UPDATES * (1 + e), LM_UPDATES * e, LM_UPDATES * e],
                "ISR-LOSS-2", counts, "per update: one rollout, one reward call, 1 + epochs forwards, epochs steps")
    return rec


def _lm_batches(rec) -> list[dict]:
    """Per update: the rollout, its reward call, the forwards, loss inputs and steps of every epoch."""
    e = rec["cfg"].epochs
    return [{**rec["samples"][u], "reward_call": rec["rewards"][u],
             "scored": rec["scored"][u * (1 + e):(u + 1) * (1 + e)],
             "losses": rec["losses"][u * e:(u + 1) * e], "steps": rec["steps"][u * e:(u + 1) * e]}
            for u in range(LM_UPDATES)]


def _generated(b) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, mask) from the sampler's own draws: each draw kept while no earlier draw was eos (the eos
    itself included), pad afterwards; prompt and padding are never response tokens."""
    drawn = torch.stack([d["tok"] for d in b["draws"]], 1)
    eos_before = torch.cumsum((drawn == b["eos"]).long(), 1) - (drawn == b["eos"]).long()
    mask = eos_before == 0
    return torch.where(mask, drawn, torch.full_like(drawn, b["pad"])), mask


class _Oracle:
    """A fresh copy of the tiny model from the init directory, loaded with recorded weights, and a plain
    full-sequence scorer (no KV cache): log p(y_t | prompt, y_<t) at a temperature."""

    def __init__(self, init: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(init).float().eval()
        self.initial = {k: v.clone() for k, v in self.model.state_dict().items()}

    def at(self, params: dict | None = None):
        self.model.load_state_dict(self.initial if params is None else params, strict=params is None)
        return self.model

    def log_probs(self, b, params=None, temperature: float = 1.0) -> torch.Tensor:
        ids = torch.cat([b["prompt_ids"], b["resp"]], 1)
        attn = torch.cat([b["prompt_mask"], torch.ones_like(b["resp"])], 1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding does not shift the positions
        logits = self.at(params)(input_ids=ids, attention_mask=attn, position_ids=pos).logits.float()
        p = b["prompt_ids"].shape[1]
        logits = logits[:, p - 1:-1] / temperature  # the logits at position i predict token i + 1
        return torch.log_softmax(logits, -1).gather(-1, b["resp"][..., None]).squeeze(-1)


@pytest.fixture(scope="module")
def oracle(lm_run):
    return _Oracle(lm_run["init"])


@pytest.mark.clause("ISR-RATIO-1")
def test_lm_update_scores_the_sampled_tokens_with_the_lagged_behaviour_log_probs(lm_run, oracle):
    """Every forward of the update scores the drawn tokens; log mu is the log-prob of each drawn token in the
    distribution it was drawn from, and that distribution is the temperature-scaled policy of behaviour_lag
    updates ago (recomputed with a full forward at the recorded weights)."""
    cfg = lm_run["cfg"]
    stale_gap = 0.0
    batches = _lm_batches(lm_run)
    for u, b in enumerate(batches):
        tokens, mask = _generated(b)
        assert_that(torch.equal(b["resp"], tokens), "ISR-RATIO-1", b["resp"], f"update {u}: the drawn tokens")
        for s in b["scored"]:
            same = torch.equal(s["resp"], tokens) and torch.equal(s["prompt_ids"], b["prompt_ids"])
            assert_that(same, "ISR-RATIO-1", s["resp"], f"update {u}: the update scores the sampled prompt + tokens")
        drawn_lp = torch.stack([torch.log(d["probs"].gather(-1, d["tok"][:, None]).squeeze(-1)) for d in b["draws"]], 1)
        err = _close(b["lp_mu"], torch.where(mask, drawn_lp, torch.zeros_like(drawn_lp)))
        assert_that(err < 1e-5, "ISR-RATIO-1", err, f"update {u}: log mu = log of the probability the draw used")
        theta_mu = batches[max(u - cfg.behaviour_lag, 0)]["steps"][0]["params"]
        with torch.no_grad():
            want = oracle.log_probs(b, theta_mu, cfg.temperature)
            now = oracle.log_probs(b, b["steps"][0]["params"], cfg.temperature)
        for e, loss in enumerate(b["losses"]):
            err = _close(loss["lp_mu"][mask], want[mask])
            assert_that(err < 2e-4, "ISR-RATIO-1", err, f"update {u} epoch {e}: log mu of the lagged behaviour")
        stale_gap = max(stale_gap, _close(want[mask], now[mask]))
    assert_that(stale_gap > 2e-3, "ISR-RATIO-1", stale_gap, "a lagged mu that differs from pi (teeth)")


@pytest.mark.clause("ISR-LOSS-1", "ISR-LOSS-2")
def test_lm_response_mask_is_exactly_the_generated_tokens(lm_run, oracle):
    """The update's mask is the generated tokens up to and including the first eos; log pi is that of the
    policy at the step's weights on those tokens (0 elsewhere) and the advantage is 0 off the mask."""
    lengths = set()
    for u, b in enumerate(_lm_batches(lm_run)):
        _, mask = _generated(b)
        lengths |= set(mask.sum(-1).tolist())
        assert_that(torch.equal(b["mask"], mask), "ISR-LOSS-2", b["mask"], f"update {u}: the sampler's mask")
        for e, (loss, step) in enumerate(zip(b["losses"], b["steps"])):
            assert_that(torch.equal(loss["mask"].bool(), mask), "ISR-LOSS-2", loss["mask"],
                        f"update {u} epoch {e}: the update's mask = the generated tokens {mask.int().tolist()}")
            with torch.no_grad():
                want = oracle.log_probs(b, step["params"]) * mask
            err = _close(loss["lp"], want)
            assert_that(err < 1e-4, "ISR-LOSS-2", err, f"update {u} epoch {e}: log pi of the response tokens")
            off = loss["adv"][~mask]
            assert_that(bool((off == 0).all()), "ISR-LOSS-2", off, f"update {u} epoch {e}: A = 0 off the mask")
    assert_that(len(lengths) >= 2 and max(lengths) <= lm_run["cfg"].max_new_tokens, "ISR-LOSS-2", sorted(lengths),
                "responses of several lengths (so a shifted mask shows)")


def _answers(prompt_ids: torch.Tensor, tok) -> list[str]:
    """The answer of each prompt "a+b=" (pad tokens dropped), decoded with the tokenizer's vocabulary."""
    out = []
    for row in prompt_ids.tolist():
        text = "".join(t for t in tok.convert_ids_to_tokens(row) if t not in tok.all_special_tokens)
        a, b = text.rstrip("=").split("+")
        out.append(str(int(a) + int(b)))
    return out


def _decoded(resp: torch.Tensor, tok) -> list[str | None]:
    """Each response up to its first eos (None without an eos)."""
    out = []
    for row in resp.tolist():
        if tok.eos_token_id not in row:
            out.append(None)
            continue
        out.append("".join(tok.convert_ids_to_tokens(row[:row.index(tok.eos_token_id)])))
    return out


def _oracle_rewards(b, tok) -> torch.Tensor:
    """1.0 where the response spells its own prompt's sum and then eos, else 0.0."""
    return torch.tensor([float(d == a) for d, a in zip(_decoded(b["resp"], tok), _answers(b["prompt_ids"], tok))])


def _group_z(r: torch.Tensor, g: int) -> torch.Tensor:
    """(r - group mean) / (population std + 1e-8) over consecutive groups of g; 0 for a group of equal rewards."""
    r = r.view(-1, g)
    std = ((r - r.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True).sqrt()
    return torch.where(std > 0, (r - r.mean(-1, keepdim=True)) / (std + 1e-8), torch.zeros_like(r)).reshape(-1)


@pytest.mark.clause("CCAPO-MACRO-1", "ISR-LOSS-2")
def test_lm_rewards_and_group_advantages_belong_to_their_samples(lm_run):
    """A sample's reward is 1 iff it spells its own prompt's sum then eos, and it is what the reward function
    returned for it; its advantage is the z-score (population std + 1e-8) within the group_size samples of its
    prompt, on every response token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(lm_run["init"])
    g = lm_run["cfg"].group_size
    mixed, batch_gap = 0, 0.0
    for u, b in enumerate(_lm_batches(lm_run)):
        prompts = b["prompt_ids"].view(-1, g, b["prompt_ids"].shape[1])
        assert_that(bool((prompts == prompts[:, :1]).all()), "CCAPO-MACRO-1", prompts,
                    f"update {u}: a group is one prompt")
        want_r = _oracle_rewards(b, tok)
        call = b["reward_call"]
        assert_that(torch.equal(call["resp"], b["resp"]) and torch.equal(call["reward"].float(), want_r),
                    "CCAPO-MACRO-1", call["reward"], f"update {u}: the reward function scored these samples {want_r}")
        z = _group_z(want_r.double(), g)
        _, mask = _generated(b)
        mixed += int((want_r.view(-1, g).amax(-1) > want_r.view(-1, g).amin(-1)).sum())
        flat = want_r.double()
        batch_gap = max(batch_gap, _close(z, (flat - flat.mean()) / (flat.std(unbiased=False) + 1e-8)))
        for e, loss in enumerate(b["losses"]):
            assert_that(torch.equal(loss["reward"].float(), want_r), "CCAPO-MACRO-1", loss["reward"],
                        f"update {u} epoch {e}: each sample's own reward")
            err = _close(loss["adv"], (z[:, None] * mask).to(loss["adv"].dtype))
            assert_that(err < 1e-5, "CCAPO-MACRO-1", err, f"update {u} epoch {e}: its group's z-score on its tokens")
    assert_that(mixed >= 2 and batch_gap > 1e-2, "CCAPO-MACRO-1", (mixed, batch_gap),
                "groups with mixed rewards whose z-scores differ from batch-wide ones (teeth)")


@pytest.mark.clause("PPO-KL-2")
def test_lm_kl_reference_is_the_frozen_initial_model(lm_run, oracle):
    """log pi_ref of the sampled tokens is the initial model's on every update, not the moving policy's."""
    moved = 0.0
    for u, b in enumerate(_lm_batches(lm_run)):
        _, mask = _generated(b)
        with torch.no_grad():
            want = oracle.log_probs(b)  # the weights in the init directory
            now = oracle.log_probs(b, b["steps"][0]["params"])
        moved = max(moved, _close(want[mask], now[mask]))
        for e, loss in enumerate(b["losses"]):
            err = _close(loss["lp_ref"][mask], want[mask])
            assert_that(err < 1e-4, "PPO-KL-2", err, f"update {u} epoch {e}: log pi_ref of the initial model")
    assert_that(moved > 2e-3, "PPO-KL-2", moved, "a policy that moved away from the reference (teeth)")


@pytest.mark.clause("ISR-LOSS-2", "PPO-KL-2")
def test_lm_optimiser_receives_the_gradient_of_the_v4_loss_on_the_sampled_batch(lm_run, oracle):
    """The gradient each step applies is that of -sum sg[w] A log pi m / (sum m + 1e-8) + kl_coef * k3 KL
    (masked mean of e^d - 1 - d, d = log pi_ref - log pi), all on the sampled batch and computed here from the
    sampler's log mu, the initial model, the oracle's rewards; then clipped to max_grad_norm."""
    from transformers import AutoTokenizer

    cfg, tok = lm_run["cfg"], AutoTokenizer.from_pretrained(lm_run["init"])
    g = cfg.group_size
    for u, b in enumerate(_lm_batches(lm_run)):
        _, mask = _generated(b)
        m = mask.float()
        adv = _group_z(_oracle_rewards(b, tok), g)[:, None] * m
        log_mu = torch.stack([torch.log(d["probs"].gather(-1, d["tok"][:, None]).squeeze(-1)) for d in b["draws"]], 1)
        with torch.no_grad():
            lp_ref = oracle.log_probs(b)
        for e, step in enumerate(b["steps"]):
            lp = oracle.log_probs(b, step["params"])
            with torch.no_grad():
                w = _v4_weight(torch.exp((lp - log_mu).clamp(-20, 20)), adv, cfg)
            pg = -(w * adv * lp * m).sum() / (m.sum() + 1e-8)
            d = (lp_ref - lp) * m
            kl = ((torch.exp(d) - 1 - d) * m).sum() / m.sum()
            names = [k for k, p in oracle.model.named_parameters()]
            grads = torch.autograd.grad(pg + cfg.kl_coef * kl, list(oracle.model.parameters()))
            total = torch.sqrt(sum((x.double() ** 2).sum() for x in grads))
            scale = min(1.0, cfg.max_grad_norm / (float(total) + 1e-6))
            got = [step["grads"].get(k) for k in names]
            assert_that(all(x is not None for x in got), "ISR-LOSS-2", [k for k, x in zip(names, got) if x is None],
                        f"update {u} epoch {e}: a gradient on every parameter at the step")
            diff = math.sqrt(sum(float(((x.double() - scale * y.double()) ** 2).sum()) for x, y in zip(got, grads)))
            rel = diff / (scale * float(total))
            assert_that(rel < 1e-3 and float(total) > 0, "ISR-LOSS-2", rel,
                        f"update {u} epoch {e}: the step's gradient is the v4 + k3 gradient of this batch")
