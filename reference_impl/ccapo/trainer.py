"""CCAPO v4.1 trainer on the key-and-chest room world (reference_impl/ccapo/env.py).

Per update: sample N trajectories on each of P layouts (one group per prompt), look every step up
in the STDB (a SQLite file in the run directory), build the dual-stream advantage, take a few
PPO-clip + KL steps, then fold the trajectories into the STDB. Every formula is a call into
reference_impl.ccapo; the clause it implements is in the trailing comment.

    rlconform train ccapo --out runs/ccapo --updates 60
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import sys

import numpy as np
import torch
from torch import nn

from reference_impl.ccapo import (
    anchor,
    fingerprint,
    fuse_advantages,
    loop_mask,
    macro_advantage,
    macro_return,
    micro_advantage,
    micro_raw_advantage,
    micro_reward,
    score_steps,
)
from reference_impl.ccapo.defaults import DEFAULTS
from reference_impl.ccapo.env import ACTIONS, OBS_DIM, KeyChestEnv, make_layout
from reference_impl.ccapo.stdb import sqlite_store
from reference_impl import _checks
from reference_impl.ccapo.update import ccapo_update
from reference_impl.common import RunDir, progress, seed_everything
from reference_impl.common.distributed import DTYPES, resolve_dtype


@dataclasses.dataclass
class Config:
    updates: int = 120  # policy updates (each: one batch of rollouts, then PPO epochs)
    prompts: int = 8  # layouts (prompts) per update; one GRPO group each
    group_size: int = 8  # trajectories per prompt (N of the macro z-score)
    max_steps: int = 20  # episode horizon
    layouts: int = 64  # size of the pool of training layouts
    layout_prior: float = 0.0  # chance a layout puts key and chest in their usual rooms (env.make_layout)
    hidden: int = 64  # MLP width
    lr: float = 3e-3  # Adam learning rate
    epochs: int = 4  # PPO epochs over each batch
    minibatch_size: int = 64  # trajectories per gradient step (64 = prompts x group_size: one step per epoch)
    grad_clip: float = 1.0  # global gradient-norm clip
    beta: float = DEFAULTS["beta"]  # micro-stream weight (CCAPO-DEFAULT-3)
    sigma_min: float = DEFAULTS["sigma_min"]  # micro z-score std floor (CCAPO-DEFAULT-3)
    clip_eps: float = DEFAULTS["clip_eps"]  # PPO clip (CCAPO-DEFAULT-4)
    beta_kl: float = DEFAULTS["beta_kl"]  # KL weight to the reference policy (CCAPO-DEFAULT-4)
    r_terminal: float = DEFAULTS["r_terminal"]  # success reward (CCAPO-DEFAULT-1)
    r_penalty: float = DEFAULTS["r_penalty"]  # per-step cost (CCAPO-DEFAULT-1)
    v_rate: float = DEFAULTS["v_rate"]  # V-bar moving-average rate (CCAPO-DEFAULT-4)
    seed: int = 0  # seeds layouts, sampling and initialisation
    device: str = "cpu"  # torch device of the policy, the sampling and the advantages
    dtype: str = "float32"  # dtype of the policy, its observations and the update (float32, float64, bfloat16)
    checkpoint_every: int = 10  # updates between checkpoints (the last update is always saved)


def score_params(cfg: Config) -> dict:
    return {"alpha_smooth": DEFAULTS["alpha_smooth"], "distance_exponent": DEFAULTS["distance_exponent"],
            "lam": DEFAULTS["lam"], "eps": DEFAULTS["eps"]}


class Policy(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, len(ACTIONS)))

    def forward(self, obs: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the admissible commands (inadmissible ones get -inf)."""
        return torch.log_softmax(self.net(obs).masked_fill(~legal, float("-inf")), -1)


# one integer id per fingerprint, for the loop filter (CCAPO-LOOP-1)
FP_IDS = {fingerprint(a, domain="alfworld"): i for i, a in enumerate(ACTIONS)}


def rollout(policy: Policy, layouts, cfg: Config, gen: torch.Generator, device) -> dict:
    """N trajectories per layout; returns padded tensors plus the per-trajectory STDB keys."""
    envs = [KeyChestEnv(lay, cfg.max_steps) for lay in layouts for _ in range(cfg.group_size)]
    B, H, dt = len(envs), cfg.max_steps, resolve_dtype(cfg.dtype)
    obs = torch.zeros(B, H, OBS_DIM, device=device, dtype=dt)
    act = torch.zeros(B, H, dtype=torch.long, device=device)
    logp = torch.zeros(B, H, device=device, dtype=dt)
    mask = torch.zeros(B, H, dtype=torch.bool, device=device)
    legal = torch.ones(B, H, len(ACTIONS), dtype=torch.bool, device=device)
    anchors = [[] for _ in range(B)]
    fps = [[] for _ in range(B)]
    for t in range(H):
        live = [i for i, e in enumerate(envs) if not e.done]
        if not live:
            break
        o = torch.tensor(np.stack([envs[i].obs() for i in live]), device=device, dtype=dt)
        lg = torch.tensor(np.stack([envs[i].legal() for i in live]), device=device)
        with torch.no_grad():
            lp = policy(o, lg)
            a = torch.multinomial(lp.exp(), 1, generator=gen).squeeze(1)  # on the device
        picks = a.tolist()  # one host sync per step: the envs are Python
        for j, i in enumerate(live):
            fp = fingerprint(ACTIONS[picks[j]], domain="alfworld")  # CCAPO-FP-1
            anchors[i].append(anchor(envs[i].location(), fps[i][-1] if fps[i] else None))  # CCAPO-ANCHOR-1
            fps[i].append(fp)
            envs[i].step(picks[j])
        idx = torch.tensor(live, device=device)
        obs[idx, t], act[idx, t], mask[idx, t], legal[idx, t] = o, a, True, lg
        logp[idx, t] = lp.gather(1, a[:, None]).squeeze(1)
    success = torch.tensor([e.success for e in envs], device=device)
    steps = torch.tensor([e.t for e in envs], device=device)
    return {"obs": obs, "act": act, "logp": logp, "mask": mask, "legal": legal, "anchors": anchors, "fps": fps,
            "success": success, "steps": steps}


def stdb_steps(anchors: list[list], fps: list[list[str]], store, H: int, device, params: dict) -> dict:
    """The STDB lookup of every step as padded [B, H] tensors on ``device`` (the store itself is host
    SQLite: one lookup per trajectory, one copy per tensor), and the loop flags built there."""
    B = len(fps)
    out = {"q": torch.zeros(B, H, dtype=torch.float64, device="cpu"),
           "v_bar": torch.zeros(B, H, dtype=torch.float64, device="cpu"),
           "edge_seen": torch.zeros(B, H, dtype=torch.bool, device="cpu"),
           "anchor_seen": torch.zeros(B, H, dtype=torch.bool, device="cpu")}
    code: dict[str, int] = {}
    # padding gets ids that differ from every real id and from each other, so it never closes a loop
    fp_ids = -1 - torch.arange(H, device="cpu").repeat(B, 1)
    for i, (anc, fp) in enumerate(zip(anchors, fps)):
        sc = score_steps(store.lookup(anc, fp), anc, fp, **params)  # CCAPO-STDB-5
        for k in out:
            out[k][i, : len(fp)] = sc[k]
        fp_ids[i, : len(fp)] = torch.tensor([code.setdefault(f, len(code)) for f in fp], dtype=torch.long, device="cpu")
    out = {k: v.to(device) for k, v in out.items()}
    out["loops"] = loop_mask(fp_ids.to(device))  # CCAPO-LOOP-1, on the trainer's device
    return out


def host_floats(stats: dict) -> dict[str, float]:
    """Scalars (device tensors or numbers) -> Python floats in one transfer per update (one stack, one ``tolist``)."""
    dev = next((v.device for v in stats.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    vals = [torch.as_tensor(v, device=dev).detach().reshape(()).to(torch.float64) for v in stats.values()]
    return dict(zip(stats, torch.stack(vals).tolist()))


def advantages(batch: dict, store, cfg: Config, device) -> tuple[torch.Tensor, dict]:
    """Dual-stream advantage [B, H] on ``device`` from the STDB as it stood before this batch."""
    mask = batch["mask"]
    sc = stdb_steps(batch["anchors"], batch["fps"], store, mask.shape[1], device, score_params(cfg))
    r_micro = micro_reward(sc["q"], sc["edge_seen"], sc["loops"])  # CCAPO-MICRO-1, CCAPO-LOOP-2
    raw = micro_raw_advantage(r_micro, sc["v_bar"], sc["anchor_seen"])  # CCAPO-MICRO-2
    r_tau = macro_return(batch["success"], batch["steps"], r_terminal=cfg.r_terminal,
                         r_penalty=cfg.r_penalty)  # CCAPO-R-1 (N_step counts loops: CCAPO-LOOP-2)
    a_macro = macro_advantage(r_tau.view(-1, cfg.group_size)).view(-1)  # CCAPO-MACRO-1, CCAPO-MACRO-2
    a_micro = micro_advantage(raw, sigma_min=cfg.sigma_min, valid=mask)  # CCAPO-MICRO-3
    a_total = fuse_advantages(a_macro, a_micro, beta=cfg.beta)  # CCAPO-FUSE-1
    return a_total.to(resolve_dtype(cfg.dtype)), {"r_tau_mean": r_tau.mean(), "stdb_hit_rate": sc["edge_seen"][mask].to(torch.float64).mean()}


def ppo_update(policy, ref, opt, batch, adv, cfg: Config, gen: torch.Generator) -> dict:
    """PPO-clip + KL epochs on the rollout (the checked ``ccapo_update``); the last minibatch's metrics."""
    rows = {"obs": batch["obs"], "legal": batch["legal"], "action": batch["act"], "logp_old": batch["logp"],
            "advantage": adv, "mask": batch["mask"]}
    records = ccapo_update(policy, ref, opt, rows, clip_eps=cfg.clip_eps, beta_kl=cfg.beta_kl, epochs=cfg.epochs,
                           minibatch_size=cfg.minibatch_size, max_grad_norm=cfg.grad_clip,
                           generator=gen)  # CCAPO-UPDATE-1 (CCAPO-PPO-1, CCAPO-PPO-2)
    return records[-1]


def train(cfg: Config, out: str, *, resume: bool = False) -> list[dict]:
    device = torch.device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny matrices: thread hand-offs cost more than they save
    # the run's identity leaves out the horizon (`--resume --updates N` may extend a finished run) and the
    # device (a checkpoint resumes on any device)
    run = RunDir(out, family="ccapo", config={k: v for k, v in dataclasses.asdict(cfg).items()
                                              if k not in ("updates", "device")}, resume=resume)
    seed_everything(cfg.seed)
    gen = torch.Generator(device).manual_seed(cfg.seed)  # sampling and minibatch shuffles, on the device
    rng = np.random.default_rng(cfg.seed)
    pool = [make_layout(rng, prior=cfg.layout_prior) for _ in range(cfg.layouts)]
    policy = Policy(cfg.hidden).to(device, resolve_dtype(cfg.dtype))
    ref = copy.deepcopy(policy).requires_grad_(False)  # pi_ref: the initial policy (CCAPO-PPO-2)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    store = sqlite_store(run.path / "stdb.sqlite", v_rate=cfg.v_rate, **score_params(cfg))
    start = 0
    ckpt = run.load() if resume else None
    if ckpt is not None:
        policy.load_state_dict(ckpt["policy"])
        ref.load_state_dict(ckpt["ref"])
        opt.load_state_dict(ckpt["opt"])
        if ckpt.get("gen_device", "cpu") == device.type:
            gen.set_state(ckpt["gen"])
        else:  # a generator state does not carry across device types: a fresh stream, seeded by the update
            gen.manual_seed(cfg.seed * 1_000_003 + ckpt["update"])
        rng.bit_generator.state = ckpt["rng"]
        store.restore(ckpt["stdb"])  # the STDB rolls back with the policy: no double-counted batch
        start = ckpt["update"] + 1
    with contextlib.ExitStack() as guards:  # input guards on for the first batch, off once it has passed
        for update in progress(range(start, cfg.updates), total=cfg.updates, initial=start, desc="ccapo"):
            layouts = [pool[i] for i in rng.choice(len(pool), cfg.prompts, replace=False)]
            batch = rollout(policy, layouts, cfg, gen, device)
            adv, stats = advantages(batch, store, cfg, device)
            diag = ppo_update(policy, ref, opt, batch, adv, cfg, gen)
            if update == start:
                guards.enter_context(_checks.validation(False))
            ok = batch["success"].tolist()
            store.update_many([{"anchors": a, "fingerprints": f, "success": s}  # CCAPO-STDB-1..4
                               for a, f, s in zip(batch["anchors"], batch["fps"], ok)])  # CCAPO-STDB-6
            shortest = np.mean([lay.shortest for lay in layouts])
            run.log(update=update, **host_floats({"success_rate": batch["success"].float().mean(),
                                                  "mean_steps": batch["steps"].float().mean(), **stats}),
                    shortest_steps=float(shortest), approx_kl=diag["approx_kl"], kl_ref=diag["kl_ref"],
                    clip_fraction=diag["clip_fraction"], loss=diag["loss"])
            if (update + 1) % cfg.checkpoint_every == 0 or update == cfg.updates - 1:
                run.save({"update": update, "policy": policy.state_dict(), "ref": ref.state_dict(),
                          "opt": opt.state_dict(), "gen": gen.get_state(), "gen_device": device.type,
                          "rng": rng.bit_generator.state, "stdb": store.snapshot()})
    store.close()
    return run.metrics()


def plot(runs: dict[str, list[list[dict]]], path: str) -> None:
    """Success rate and mean episode length vs update: mean over seeds, one line per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, seeds in runs.items():
        n = min(len(m) for m in seeds)
        for ax, key in zip(axes, ("success_rate", "mean_steps")):
            y = np.mean([[r[key] for r in m[:n]] for m in seeds], axis=0)
            y = np.convolve(y, np.ones(5) / 5, mode="valid")  # 5-update moving average
            ax.plot(np.arange(len(y)) + 4, y, label=label)
    shortest = np.mean([r["shortest_steps"] for seeds in runs.values() for m in seeds for r in m])
    axes[1].axhline(shortest, color="grey", ls=":", label=f"shortest path ({shortest:.1f})")
    for ax, t in zip(axes, ("success rate", "mean steps per episode")):
        ax.set_xlabel("update")
        ax.set_title(t)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlconform train ccapo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--updates", "--steps", type=int, default=Config.updates, dest="updates")
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--device", default=Config.device)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=Config.dtype)
    p.add_argument("--prompts", type=int, default=Config.prompts)
    p.add_argument("--group-size", type=int, default=Config.group_size)
    p.add_argument("--beta", type=float, default=Config.beta)
    p.add_argument("--layout-prior", type=float, default=Config.layout_prior)
    p.add_argument("--checkpoint-every", type=int, default=Config.checkpoint_every)
    a = p.parse_args(argv)
    cfg = Config(updates=a.updates, seed=a.seed, device=a.device, dtype=a.dtype, prompts=a.prompts, group_size=a.group_size,
                 beta=a.beta, layout_prior=a.layout_prior, checkpoint_every=a.checkpoint_every)
    metrics = train(cfg, a.out, resume=a.resume)
    if metrics:
        last = metrics[-1]
        print(f"update {last['update']}: success_rate={last['success_rate']:.2f} mean_steps={last['mean_steps']:.1f} "
              f"stdb_hit_rate={last['stdb_hit_rate']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
