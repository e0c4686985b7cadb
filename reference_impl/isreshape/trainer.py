"""IS Reshape v4 on an off-policy token bandit: a tabular softmax policy over K tokens per context.

Rollouts come from a stale, epsilon-mixed behaviour policy mu (refreshed every ``behaviour_lag``
updates, as in asynchronous RL), rewards are Bernoulli with a per-(context, token) success
probability, advantages use the group mean as baseline, and each update takes ``epochs`` Adam steps
on the batch. ``--loss`` picks the objective: ``v4`` (ISR-LOSS-1, the corrected loss), ``doc`` (the
document's §9 code, zero gradient: it must not learn), ``ppo`` (PPO-clip against mu, a baseline) or
``ppo-decoupled`` (decoupled PPO, Hilton et al. 2021: clipped against the policy at the start of the update,
the proximal policy, and corrected from mu by the weight pi_prox / mu: the fair baseline against a stale mu).
Several comma-separated losses run one after the other into ``OUT/<loss>``; ``--plot`` then draws
reward against update for all of them. ``rlconform train isreshape --updates N --out DIR``.

Sampling, rewards and advantages run on ``--device`` in ``--dtype``. Data-parallel:
``torchrun --nproc_per_node N -m reference_impl.isreshape.trainer ...`` draws ``batch_contexts``
contexts per process with per-rank seeds, DDP averages the gradients of the logits table, and rank
0 writes metrics and checkpoints.
"""
from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from reference_impl import _checks
from reference_impl.common import (
    RunDir,
    add_config_flags,
    arg,
    config_overrides,
    progress,
    seed_everything,
)
from reference_impl.common import distributed as ddp
from reference_impl.isreshape.defaults import defaults
from reference_impl.isreshape.losses import (
    document_policy_loss,
    loss_metrics,
    policy_loss,
)
from reference_impl.isreshape.weights import importance_ratio
from reference_impl.ppo.losses import (
    clipped_policy_loss,  # PPO-LOSS-1: the ppo family's baseline
)

DEFAULTS = defaults()  # ISR-DEFAULT-*
LOSSES = ("v4", "doc", "ppo", "ppo-decoupled")


@dataclass
class IsReshapeConfig:
    loss: str = arg("v4", "objective: v4 (corrected IS Reshape loss), doc (the document's zero-gradient code), ppo "
                          "(clipped against mu), ppo-decoupled (clipped against the proximal policy)")
    seed: int = arg(0, "seed of the policy init, the sampling and the rewards")
    env_seed: int = arg(1234, "seed of the bandit's success probabilities (fixed across losses)")
    device: str = arg("cpu", "torch device of the table, the sampling and the update (cuda: cuda:LOCAL_RANK per process)")
    dtype: str = arg("float64", "dtype of the logits table, rewards and advantages (float64, float32, bfloat16)")
    contexts: int = arg(16, "number of contexts x (prompts)")
    tokens: int = arg(32, "number of tokens y per context")
    reward_sharpness: float = arg(3.0, "success probability p(x, y) = sigmoid(sharpness * z), z ~ N(0, 1)")
    batch_contexts: int = arg(64, "contexts drawn per update (per process under torchrun)")
    group_size: int = arg(8, "samples per context; their mean reward is the baseline")
    epochs: int = arg(4, "Adam steps on each batch (the later ones are off-policy)")
    lr: float = arg(0.05, "Adam learning rate of the tabular logits")
    behaviour_lag: int = arg(4, "updates between refreshes of the behaviour policy mu")
    behaviour_eps: float = arg(0.2, "mu = (1 - eps) * pi_stale + eps * uniform")
    tau: float = arg(DEFAULTS["tau"], "trust-region temperature tau")
    beta: float = arg(DEFAULTS["beta"], "reward sensitivity beta of gamma(|A|)")
    gamma_min: float = arg(DEFAULTS["gamma_min"], "lower gamma bound")
    gamma_max: float = arg(DEFAULTS["gamma_max"], "upper gamma bound")
    clip_eps: float = arg(0.2, "clip range of the ppo baseline")
    checkpoint_every: int = arg(10, "updates between checkpoints (the last update always checkpoints)")


class TokenBandit:
    """Contexts x tokens with Bernoulli rewards; the success table is fixed by ``env_seed``."""

    def __init__(self, cfg: IsReshapeConfig, device: torch.device, dtype: torch.dtype):
        g = torch.Generator().manual_seed(cfg.env_seed)  # the table is the same on every device and rank
        z = torch.randn(cfg.contexts, cfg.tokens, generator=g, dtype=torch.float64, device="cpu")
        self.p = torch.sigmoid(cfg.reward_sharpness * z).to(device, dtype)

    def rewards(self, ctx: torch.Tensor, tok: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        u = torch.rand(tok.shape, generator=gen, dtype=self.p.dtype, device=self.p.device)
        return (u < self.p[ctx, tok]).to(self.p.dtype)

    def expected_reward(self, probs: torch.Tensor) -> torch.Tensor:
        """E_{x uniform, y ~ pi}[p(x, y)]: the exact reward of the policy, no sampling noise (a device scalar)."""
        return (probs * self.p).sum(-1).mean()

    def best_reward(self) -> float:
        return float(self.p.max(-1).values.mean())


class TabularPolicy(torch.nn.Module):
    """One row of logits per context (zeros at the start: the uniform policy); forward gives log pi(.|x)."""

    def __init__(self, contexts: int, tokens: int, *, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(contexts, tokens, device=device, dtype=dtype))

    def forward(self, ctx: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits[ctx], -1)


def behaviour_probs(logits: torch.Tensor, eps: float) -> torch.Tensor:
    """A stale, explorative copy of the policy: (1 - eps) softmax + eps uniform, detached."""
    probs = torch.softmax(logits.detach(), -1)
    return (1.0 - eps) * probs + eps / probs.shape[-1]


def objective(cfg: IsReshapeConfig, log_prob, ref_log_prob, adv, mask, prox_log_prob=None) -> torch.Tensor:
    """The scalar loss of the chosen ``cfg.loss`` on one batch (all see the same mu and A).

    ``prox_log_prob``: log pi_prox, the policy before this update's first step (detached), for ``ppo-decoupled``.
    """
    hp = dict(tau=cfg.tau, beta=cfg.beta, gamma_min=cfg.gamma_min, gamma_max=cfg.gamma_max)
    if cfg.loss == "v4":
        return policy_loss(log_prob, ref_log_prob, adv, mask, **hp)  # ISR-LOSS-1, ISR-LOSS-2
    if cfg.loss == "doc":
        return document_policy_loss(log_prob, ref_log_prob, adv, mask, **hp)  # ISR-LOSS-1 errata: zero gradient
    if cfg.loss == "ppo-decoupled":
        # -E_mu[(pi_prox/mu) min(r A, clip(r) A)] with r = pi/pi_prox; a detached weight >= 0 moves inside min
        behaviour = importance_ratio(prox_log_prob, ref_log_prob).detach()  # pi_prox / mu (ISR-RATIO-1's form)
        r = importance_ratio(log_prob, prox_log_prob)  # pi / pi_prox: the trust region is around the proximal policy
        return clipped_policy_loss(r, behaviour * adv, clip_eps=cfg.clip_eps)  # PPO-LOSS-1 on the corrected advantage
    r = importance_ratio(log_prob, ref_log_prob)  # ISR-RATIO-1 (differentiable here)
    return clipped_policy_loss(r, adv, clip_eps=cfg.clip_eps)


def train(cfg: IsReshapeConfig, *, out: str | Path, updates: int, resume: bool = False) -> RunDir:
    """Train until ``updates`` updates are done in total (a resumed run continues its count)."""
    if cfg.loss not in LOSSES:
        raise ValueError(f"--loss must be one of {LOSSES}, got {cfg.loss!r}")
    d = ddp.setup(cfg.device)  # one process, or this rank of a torchrun job
    device, dtype = d.device, ddp.resolve_dtype(cfg.dtype)
    seed_everything(cfg.seed)
    seed = ddp.rank_seed(cfg.seed, d.rank)
    gen = torch.Generator(device).manual_seed(seed)  # contexts, tokens and rewards of this rank
    env = TokenBandit(cfg, device, dtype)
    table = TabularPolicy(cfg.contexts, cfg.tokens, device=device, dtype=dtype)
    opt = torch.optim.Adam(table.parameters(), lr=cfg.lr)
    mu = behaviour_probs(table.logits, cfg.behaviour_eps)
    run = RunDir(out, family="isreshape", config=ddp.portable_config(cfg), resume=resume, writer=d.is_writer)
    start = 0
    ckpt = run.load() if resume else None
    if ckpt is not None:
        with torch.no_grad():
            table.logits.copy_(ckpt["logits"])  # saved on any device; copied onto this one
        opt.load_state_dict(ckpt["optimizer"])
        mu = ckpt["behaviour"].to(device, dtype)
        ddp.restore_rng(ckpt["rng"], d, gen, reseed=seed)
        start = int(ckpt["update"]) + 1
    policy = ddp.wrap(table, d)  # gradients of the table averaged over ranks
    best = env.best_reward()
    with contextlib.ExitStack() as guards:  # input guards on for the first batch only
        for update in progress(range(start, updates), total=updates, initial=start, desc=f"isreshape/{cfg.loss}",
                               disable=None if d.is_writer else True):
            if update % cfg.behaviour_lag == 0:
                mu = behaviour_probs(table.logits, cfg.behaviour_eps)  # rollouts come from a stale mu
            ctx = torch.randint(cfg.contexts, (cfg.batch_contexts,), generator=gen, device=device)
            ctx = ctx.repeat_interleave(cfg.group_size)
            tok = torch.multinomial(mu[ctx], 1, generator=gen).squeeze(-1)
            reward = env.rewards(ctx, tok, gen)
            group = reward.view(cfg.batch_contexts, cfg.group_size)
            adv = (group - group.mean(-1, keepdim=True)).reshape(-1)  # group-mean baseline
            ref_lp = torch.log(mu[ctx, tok])  # log mu of the behaviour policy
            mask = torch.ones_like(reward)
            prox_lp = None
            if cfg.loss == "ppo-decoupled":
                with torch.no_grad():
                    prox_lp = policy(ctx).gather(-1, tok[:, None]).squeeze(-1)  # pi_prox: the policy now
            for _ in range(cfg.epochs):
                lp = policy(ctx).gather(-1, tok[:, None]).squeeze(-1)
                loss = objective(cfg, lp, ref_lp, adv, mask, prox_lp)
                opt.zero_grad(set_to_none=True)
                if loss.requires_grad:  # the document's loss has no graph at all
                    loss.backward()
                opt.step()
            stats = loss_metrics(lp.detach(), ref_lp, adv, mask, tau=cfg.tau, beta=cfg.beta,  # ISR-METRIC-1..3
                                 gamma_min=cfg.gamma_min, gamma_max=cfg.gamma_max)
            if update == start:  # the first batch passed every input guard: the rest run without them
                guards.enter_context(_checks.validation(False))
            with torch.no_grad():
                pi = torch.softmax(table.logits, -1)
                grad = table.logits.grad
                dev = {"loss": loss.detach(), "sample_reward": reward.mean(), "mean_reward": env.expected_reward(pi),
                       "grad_norm": grad.norm() if grad is not None else torch.zeros((), device=device, dtype=dtype)}
            wide = torch.promote_types(dtype, torch.float32)  # bf16 metrics are read in float32, float64 stays
            host = dict(zip(dev, torch.stack([v.to(wide) for v in dev.values()]).tolist()))  # one transfer per update
            rec = dict(loss=host.pop("loss"), sample_reward=host.pop("sample_reward"), **stats)
            run.log(update=update, loss_name=cfg.loss, best_reward=best, **host,
                    **ddp.reduce_metrics(rec, d, maximum=("weight_max",)))
            if (update + 1) % cfg.checkpoint_every == 0 or update == updates - 1:
                run.save({"update": update, "logits": table.logits.detach().clone(), "optimizer": opt.state_dict(),
                          "behaviour": mu, "rng": ddp.rng_states(d, gen)})
    return run


def plot(run_dirs: dict[str, Path], png: Path) -> None:
    """Reward of the policy against update, one line per loss (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    best = None
    for name, d in run_dirs.items():
        recs = [json.loads(ln) for ln in (Path(d) / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        ax.plot([r["update"] for r in recs], [r["mean_reward"] for r in recs], label=name)
        best = recs[-1]["best_reward"] if recs else best
    if best is not None:
        ax.axhline(best, color="grey", ls=":", label="optimal policy")
    ax.set_xlabel("update")
    ax.set_ylabel("expected reward of pi")
    ax.set_title("IS Reshape v4 on an off-policy token bandit")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlconform train isreshape", description=__doc__.strip().splitlines()[0])
    p.add_argument("--updates", "--steps", type=int, default=150, help="total updates (a resumed run counts on)")
    p.add_argument("--out", required=True, help="run directory (OUT/<loss> when several losses are given)")
    p.add_argument("--resume", action="store_true", help="continue the run(s) in --out from the checkpoint")
    p.add_argument("--plot", action="store_true", help="write OUT/reward_vs_update.png")
    add_config_flags(p, IsReshapeConfig)
    args = p.parse_args(argv)
    base = config_overrides(args, IsReshapeConfig)
    names = [s.strip() for s in base.pop("loss", "v4").split(",") if s.strip()]
    out = Path(args.out)
    dirs = {}
    for name in names:
        d = out / name if len(names) > 1 else out
        run = train(IsReshapeConfig(**base, loss=name), out=d, updates=args.updates, resume=args.resume)
        if not run.writer:
            continue
        last = run.metrics()[-1] if run.metrics() else {}
        print(f"isreshape/{name}: {last.get('update', -1) + 1} updates, mean_reward {last.get('mean_reward', float('nan')):.3f} "
              f"(optimal {last.get('best_reward', float('nan')):.3f}), kl {last.get('kl', float('nan')):.4f}; "
              f"metrics in {run.metrics_path}")
        dirs[name] = d
    ddp.teardown()
    if not run.writer:
        return 0
    if args.plot:
        plot(dirs, out / "reward_vs_update.png")
        print(f"plot: {out / 'reward_vs_update.png'}")
    return 0


if __name__ == "__main__":  # torchrun --nproc_per_node N -m reference_impl.isreshape.trainer --updates U --out DIR
    import sys

    ddp.exit_process(cli(sys.argv[1:]))
