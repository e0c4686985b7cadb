"""IS Reshape v4 on a causal language model: token-level off-policy policy gradient with a verifiable reward.

Each update samples ``group_size`` responses per prompt from a behaviour policy mu that lags the
policy by ``behaviour_lag`` updates and runs in ``sample_dtype`` (bf16 by default) while the policy
trains in ``dtype`` (float32): the train-inference mismatch of asynchronous RL. The reward is an
exact-match check of the answer; advantages are GRPO z-scores within each prompt's group, broadcast
over the response tokens. The arm picks the token loss, every one a reference op:

* ``v4``   corrected IS Reshape v4, -sg[w_gamma(|A|)(r)] A log pi (ISR-LOSS-1, ISR-LOSS-2)
* ``ppo``  PPO-clip on r = pi / mu (PPO-LOSS-1)
* ``sapo`` SAPO's soft gate with sign-selected temperatures (ISR-SAPO-2, ISR-SAPO-3)
* ``is``   vanilla importance sampling, no clip (the "noclip" arm of seed 003 §1.1)
* ``sft``  the SFT variant with a fixed gamma_sft on the responses that earned reward 1 (ISR-SFT-1)

All arms add ``kl_coef`` times the k3 KL to the frozen pre-trained reference (PPO-KL-2). Several
arms and seeds run from one command into ``OUT/<arm>/seed<S>``:
``python -m reference_impl.isreshape.lm --arms all --seeds 3 --updates 60 --out DIR``.
"""
from __future__ import annotations

import argparse
import contextlib
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from reference_impl import _checks
from reference_impl.ccapo.advantages import macro_advantage
from reference_impl.common import (
    RunDir,
    add_config_flags,
    arg,
    config_overrides,
    progress,
)
from reference_impl.isreshape.defaults import defaults
from reference_impl.isreshape.lm import model as lm
from reference_impl.isreshape.lm import task as task_mod
from reference_impl.isreshape.lm.losses import (
    as_token_mean,
    importance_sampling_loss,
    masked_mean,
    ratio_stats,
)
from reference_impl.isreshape.lm.plot import write_summary
from reference_impl.isreshape.losses import loss_metrics, policy_loss, sft_loss
from reference_impl.isreshape.sapo import sapo_policy_loss
from reference_impl.isreshape.weights import importance_ratio
from reference_impl.ppo.losses import (
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    k3_kl,
)

DEFAULTS = defaults()  # ISR-DEFAULT-*
ARMS = ("v4", "ppo", "sapo", "is", "sft")


@dataclass
class LmConfig:
    arm: str = arg("v4", f"token loss: one of {', '.join(ARMS)}")
    seed: int = arg(0, "seed of the prompt draws and the sampling")
    device: str = arg("cpu", "torch device of the policy, the behaviour and the reference model (cpu, cuda, cuda:1)")
    dtype: str = arg("float32", "training dtype of the policy (float32, bf16)")
    sample_dtype: str = arg("bf16", "dtype of the behaviour policy that samples (bf16: a train-inference mismatch)")
    model: str = arg("", "AutoModelForCausalLM name or path; empty: the tiny local model, pre-trained in OUT/init")
    threads: int = arg(1, "torch CPU threads (0 keeps torch's default)")
    # task
    max_operand: int = arg(29, "addition problems a+b with 0 <= a, b <= max_operand")
    heldout_frac: float = arg(0.2, "share of the problems held out for evaluation")
    task_seed: int = arg(0, "seed of the train / held-out split (fixed across arms and seeds)")
    max_new_tokens: int = arg(4, "response length T (the answer, eos, then pad)")
    # tiny default model and its pre-training
    hidden: int = arg(64, "hidden size of the tiny Llama")
    layers: int = arg(2, "layers of the tiny Llama")
    heads: int = arg(4, "attention heads of the tiny Llama")
    pretrain_steps: int = arg(200, "supervised steps on demonstrations before RL (brief: the init is weak)")
    pretrain_lr: float = arg(3e-3, "AdamW learning rate of pre-training")
    pretrain_seed: int = arg(0, "seed of the tiny model's init and pre-training (shared by every arm and seed)")
    # rollouts and updates
    batch_prompts: int = arg(16, "prompts per update")
    group_size: int = arg(8, "responses per prompt; GRPO advantages are z-scores within the group")
    temperature: float = arg(1.0, "sampling temperature of the behaviour policy")
    behaviour_lag: int = arg(2, "mu is the policy of this many updates ago (0: current weights, only the dtype differs)")
    epochs: int = arg(2, "optimizer steps on each batch (the later ones are further off-policy)")
    lr: float = arg(1e-3, "AdamW learning rate of the policy")
    max_grad_norm: float = arg(1.0, "global grad-norm clip (the logged grad_norm is before clipping)")
    kl_coef: float = arg(0.02, "coefficient of the k3 KL to the frozen reference model")
    # objective hyper-parameters
    tau: float = arg(DEFAULTS["tau"], "trust-region temperature tau of v4 and sft")
    beta: float = arg(DEFAULTS["beta"], "reward sensitivity beta of gamma(|A|)")
    gamma_min: float = arg(DEFAULTS["gamma_min"], "lower gamma bound")
    gamma_max: float = arg(DEFAULTS["gamma_max"], "upper gamma bound")
    gamma_sft: float = arg(DEFAULTS["gamma_sft"], "fixed gamma of the sft arm")
    clip_eps: float = arg(0.2, "clip range of ppo (and of the clip_fraction diagnostic)")
    tau_pos: float = arg(1.0, "SAPO temperature for A > 0 (the seed gives no value)")
    tau_neg: float = arg(1.05, "SAPO temperature for A <= 0; the seed only says tau_neg > tau_pos")
    # bookkeeping
    eval_every: int = arg(5, "updates between greedy evaluations on the held-out problems")
    checkpoint_every: int = arg(10, "updates between checkpoints (the last update always checkpoints)")
    validate: int = arg(1, "input guards (each reads a value back to the host): 1 on the first update only, 2 on every update, 0 off")


# ----------------------------------------------------------------------------- the token loss of each arm
def arm_loss(cfg: LmConfig, lp, lp_mu, lp_ref, adv, mask, reward) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, kl_ref) on one batch: the arm's token loss plus kl_coef times the k3 KL to the reference.

    lp, lp_mu, lp_ref, adv, mask: [N, T]; reward: [N]. Only lp carries a gradient.
    """
    m = mask.to(lp.dtype)
    hp = dict(tau=cfg.tau, beta=cfg.beta, gamma_min=cfg.gamma_min, gamma_max=cfg.gamma_max)
    if cfg.arm == "v4":
        pg = policy_loss(lp, lp_mu, adv, m, **hp)  # ISR-LOSS-1, ISR-LOSS-2
    elif cfg.arm == "sapo":
        pg = sapo_policy_loss(lp, lp_mu, adv, m, tau_pos=cfg.tau_pos, tau_neg=cfg.tau_neg)  # ISR-SAPO-2, ISR-SAPO-3
    elif cfg.arm == "sft":
        solved = m * (reward[:, None] > 0).to(m.dtype)  # the SFT data: responses that earned the reward
        pg = sft_loss(lp, lp_mu, solved, tau=cfg.tau, gamma_sft=cfg.gamma_sft)  # ISR-SFT-1
    elif cfg.arm == "ppo":
        r = importance_ratio(lp, lp_mu)  # ISR-RATIO-1, differentiable in lp
        pg = as_token_mean(clipped_policy_loss(r, adv * m, clip_eps=cfg.clip_eps), m)  # PPO-LOSS-1
    elif cfg.arm == "is":
        pg = importance_sampling_loss(lp, lp_mu, adv, m)  # seed 003 §1.1 noclip baseline
    else:
        raise ValueError(f"arm must be one of {ARMS}, got {cfg.arm!r}")
    ref_or_self = torch.where(mask, lp_ref, lp.detach())  # masked-out tokens add exactly 0 to the KL
    kl_ref = as_token_mean(k3_kl(lp, ref_or_self), m)  # PPO-KL-2: k3 of KL(pi || pi_ref)
    return pg + cfg.kl_coef * kl_ref, kl_ref.detach()


# ----------------------------------------------------------------------------- setup
def _problems(cfg: LmConfig, tok, device):
    train_pairs, held_pairs = task_mod.addition_pairs(cfg.max_operand, cfg.heldout_frac, cfg.task_seed)
    return (task_mod.encode(tok, train_pairs, cfg.max_new_tokens).to(device),
            task_mod.encode(tok, held_pairs, cfg.max_new_tokens).to(device))


def init_path(cfg: LmConfig, out_root: Path) -> str:
    """``--model`` as given, or the tiny local model pre-trained once into ``out_root/init``."""
    if cfg.model:
        return cfg.model
    train_pairs, _ = task_mod.addition_pairs(cfg.max_operand, cfg.heldout_frac, cfg.task_seed)
    d = lm.build_default_init(out_root / "init", pairs=train_pairs, max_new_tokens=cfg.max_new_tokens,
                              hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads, steps=cfg.pretrain_steps,
                              lr=cfg.pretrain_lr, batch=64, seed=cfg.pretrain_seed)
    return str(d)


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _to_cpu(obj):
    """State (tensors nested in dicts/lists) on the CPU, so a checkpoint loads on any device."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


@torch.no_grad()
def heldout_accuracy(model, tok, problems, cfg: LmConfig) -> torch.Tensor:
    """Greedy exact-match accuracy of ``model`` on ``problems`` (a device scalar)."""
    resp, _, _ = lm.generate(model, problems.prompt_ids, problems.prompt_mask, max_new_tokens=cfg.max_new_tokens,
                             eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=None, greedy=True)
    return task_mod.exact_match(resp, problems.target_ids).mean()


# ----------------------------------------------------------------------------- the loop
def train(cfg: LmConfig, *, out: str | Path, updates: int, resume: bool = False, model_path: str | None = None) -> RunDir:
    """Train until ``updates`` updates are done in total (a resumed run continues its count)."""
    if cfg.arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {cfg.arm!r}")
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    device, dtype, sample_dtype = torch.device(cfg.device), lm.dtype_of(cfg.dtype), lm.dtype_of(cfg.sample_dtype)
    out = Path(out)
    path = model_path or init_path(cfg, out)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    policy, tok = lm.load(path, device=device, dtype=dtype)
    reference = lm.frozen_copy(policy)  # the frozen pre-trained model of the KL term
    behaviour = lm.frozen_copy(policy, sample_dtype)  # mu: lagged weights in the sampling dtype
    train_set, heldout = _problems(cfg, tok, device)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    lagged: list[dict[str, torch.Tensor]] = []  # policy weights of the last behaviour_lag + 1 updates
    run = RunDir(out, family="isreshape-lm", config=cfg, resume=resume)
    start = 0
    ckpt = run.load() if resume else None
    if ckpt is not None:
        policy.load_state_dict(ckpt["policy"])
        opt.load_state_dict(ckpt["optimizer"])  # moves the Adam state to the parameters' device
        lagged = [{k: v.to(device) for k, v in s.items()} for s in ckpt["lagged"]]
        if ckpt["generator_device"] == device.type:
            gen.set_state(ckpt["generator"])
        else:  # a CPU generator state does not fit a CUDA generator: reseed, deterministically
            gen.manual_seed(cfg.seed * 1_000_003 + int(ckpt["update"]))
        random.setstate(ckpt["python_rng"])
        np.random.set_state(ckpt["numpy_rng"])
        start = int(ckpt["update"]) + 1
    n, g, t_new = cfg.batch_prompts * cfg.group_size, cfg.group_size, cfg.max_new_tokens
    acc_init = heldout_accuracy(policy, tok, heldout, cfg) if start == 0 else None
    with contextlib.ExitStack() as guards:
        guards.enter_context(_checks.validation(cfg.validate > 0))
        for update in progress(range(start, updates), total=updates, initial=start, desc=f"isreshape-lm/{cfg.arm}/s{cfg.seed}"):
            # behaviour policy: the weights of `behaviour_lag` updates ago, cast to the sampling dtype
            lagged = (lagged + [_snapshot(policy)])[-(cfg.behaviour_lag + 1):]
            behaviour.load_state_dict(lagged[0])
            # rollouts: group_size responses per prompt, all on the device
            idx = torch.randint(len(train_set), (cfg.batch_prompts,), generator=gen, device=device).repeat_interleave(g)
            prompt_ids, prompt_mask = train_set.prompt_ids[idx], train_set.prompt_mask[idx]
            resp, lp_mu, mask = lm.generate(behaviour, prompt_ids, prompt_mask, max_new_tokens=t_new,
                                            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=gen,
                                            temperature=cfg.temperature)
            reward = task_mod.exact_match(resp, train_set.target_ids[idx])  # verifiable reward, 1.0 or 0.0
            adv_seq = macro_advantage(reward.view(cfg.batch_prompts, g)).reshape(n)  # CCAPO-MACRO-1: GRPO z-score
            adv = adv_seq[:, None].expand(n, t_new) * mask  # outcome advantage on every response token
            with torch.no_grad():
                lp_ref = lm.token_log_probs(lm.response_logits(reference, prompt_ids, prompt_mask, resp), resp)
            for epoch in range(cfg.epochs):
                logits = lm.response_logits(policy, prompt_ids, prompt_mask, resp)
                lp = lm.token_log_probs(logits, resp) * mask  # masked-out tokens: log-prob 0, no gradient
                loss, kl_ref = arm_loss(cfg, lp, lp_mu, lp_ref, adv, mask, reward)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                if epoch == 0:  # the mismatch before any step on this batch: lag + sampling dtype only
                    kl_first = as_token_mean(approx_kl(lp_mu, lp.detach()), mask)  # PPO-KL-1: k1 of KL(mu || pi)
                opt.step()
            # diagnostics of the last epoch's forward pass (before its step), one host sync at the end
            with torch.no_grad():
                lpd = lp.detach()
                r = importance_ratio(lpd, lp_mu)  # ISR-RATIO-1
                ent = masked_mean(torch.distributions.Categorical(logits=logits.detach().float()).entropy(), mask)
                ones = torch.where(mask, r, torch.ones_like(r))  # masked-out tokens are never "clipped"
                dev_stats = {"reward": reward.mean(), "kl_ref": kl_ref, "kl_mu_pi_first": kl_first, "entropy": ent,
                             "grad_norm": grad_norm, "loss": loss.detach(), "response_len": mask.sum(-1).float().mean(),
                             "clip_fraction": as_token_mean(clip_fraction(ones, clip_eps=cfg.clip_eps), mask),  # PPO-CLIPFRAC-1
                             **ratio_stats(r, mask)}
            host = dict(zip(dev_stats, torch.stack([v.float() for v in dev_stats.values()]).tolist()))
            isr = loss_metrics(lpd, lp_mu, adv, mask.to(lpd.dtype), **{k: getattr(cfg, k) for k in  # ISR-METRIC-1..3
                               ("tau", "beta", "gamma_min", "gamma_max")})
            isr["kl_mu_pi"] = isr.pop("kl")  # k1 estimate of KL(mu || pi) on the behaviour's samples
            extra = {"heldout_acc_init": float(acc_init)} if update == 0 and acc_init is not None else {}
            if (update + 1) % cfg.eval_every == 0 or update == updates - 1:  # greedy accuracy after this update
                extra["heldout_acc"] = float(heldout_accuracy(policy, tok, heldout, cfg))
            run.log(update=update, arm=cfg.arm, seed=cfg.seed, **host, **isr, **extra)
            if update == start and cfg.validate == 1:  # the first batch passed every guard: the rest run without them
                guards.enter_context(_checks.validation(False))
            if (update + 1) % cfg.checkpoint_every == 0 or update == updates - 1:
                run.save(_to_cpu({"update": update, "policy": policy.state_dict(), "optimizer": opt.state_dict(),
                                  "lagged": lagged, "generator": gen.get_state(), "generator_device": device.type,
                                  "python_rng": random.getstate(), "numpy_rng": np.random.get_state()}))
    return run


# ----------------------------------------------------------------------------- command line
def _run_one(job: tuple[dict, str, int, bool, str]) -> str:
    cfg_kw, out, updates, resume, model_path = job
    run = train(LmConfig(**cfg_kw), out=out, updates=updates, resume=resume, model_path=model_path)
    last = run.metrics()[-1] if run.metrics() else {}
    return (f"isreshape-lm/{cfg_kw['arm']}/seed{cfg_kw['seed']}: {last.get('update', -1) + 1} updates, "
            f"reward {last.get('reward', float('nan')):.3f}, kl_ref {last.get('kl_ref', float('nan')):.4f}; {run.metrics_path}")


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlconform train isreshape-lm", description=__doc__.strip().splitlines()[0])
    p.add_argument("--updates", "--steps", type=int, default=60, help="total updates per run (a resumed run counts on)")
    p.add_argument("--out", required=True, help="root directory: runs go to OUT/<arm>/seed<S>, the tiny init to OUT/init")
    p.add_argument("--arms", default=None, help=f"comma-separated arms or 'all' ({','.join(ARMS)}); default: --arm")
    p.add_argument("--seeds", type=int, default=None, help="run seeds 0..N-1 (default: the single --seed)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (each with --threads threads)")
    p.add_argument("--resume", action="store_true", help="continue the runs in --out from their checkpoints")
    p.add_argument("--plot", action="store_true", help="write OUT/reward_vs_update.png and OUT/summary.md")
    add_config_flags(p, LmConfig)
    args = p.parse_args(argv)
    base = config_overrides(args, LmConfig)
    arms = list(ARMS) if args.arms == "all" else [a.strip() for a in (args.arms or base.get("arm", "v4")).split(",") if a.strip()]
    seeds = list(range(args.seeds)) if args.seeds is not None else [base.get("seed", 0)]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        p.error(f"unknown arm(s) {bad}; choose from {ARMS}")
    out = Path(args.out)
    model_path = init_path(LmConfig(**base), out)  # pre-train the tiny init once, before any run
    jobs = [({**base, "arm": a, "seed": s}, str(out / a / f"seed{s}"), args.updates, args.resume, model_path)
            for a in arms for s in seeds]
    if args.jobs > 1:
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            for line in ex.map(_run_one, jobs):
                print(line, flush=True)
    else:
        for job in jobs:
            print(_run_one(job), flush=True)
    if args.plot:
        print(write_summary(out, arms))
    return 0
