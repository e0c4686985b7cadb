"""CCAPO v4.1 on real TextWorld cooking games, with GRPO and GiGPO arms side by side.

Per update: pick P training games, play N episodes of each (one GRPO group per game), look every
step up in the STDB (a SQLite file per run), build the arm's advantage, take a few PPO-clip + KL
steps, then fold the episodes into the STDB. Every few updates the policy plays the held-out games
(sampling, as it acts in training) and the STDB is only read. Every formula is a call into
reference_impl.ccapo (or, for the GiGPO arm's step grouping, textworld/gigpo.py); the clause it
implements is in the trailing comment.

    rlconform train ccapo-textworld --out runs/ccapo-tw --arms ccapo,grpo,gigpo --seeds 0,1,2
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import sys
from pathlib import Path

import torch

from reference_impl.ccapo import (
    anchor,
    fingerprint,
    fuse_advantages,
    macro_advantage,
    macro_return,
    micro_advantage,
    micro_raw_advantage,
    micro_reward,
    policy_loss,
)
from reference_impl import _checks
from reference_impl.ccapo.defaults import DEFAULTS
from reference_impl.ccapo.stdb import sqlite_store
from reference_impl.ccapo.textworld import gigpo
from reference_impl.ccapo.textworld.env import TextWorldEnv
from reference_impl.ccapo.textworld.games import GameSpec, train_and_heldout
from reference_impl.ccapo.textworld.policy import TextPolicy, Tokenizer
from reference_impl.ccapo.trainer import host_floats, stdb_steps
from reference_impl.ccapo.update import step as clipped_step
from reference_impl.common import RunDir, progress, seed_everything
from reference_impl.common.distributed import resolve_dtype

ARMS = {"ccapo": DEFAULTS["beta"], "grpo": 0.0, "gigpo": 0.0}  # arm -> beta of the CCAPO micro stream
DOMAIN = "textworld"


@dataclasses.dataclass
class Config:
    arm: str = "ccapo"  # ccapo (beta = 0.5), grpo (macro stream only, beta = 0) or gigpo (anchor-state groups)
    updates: int = 40  # policy updates (each: one batch of episodes, then PPO epochs)
    prompts: int = 2  # games per update; one GRPO group each
    group_size: int = 8  # episodes per game (N of the macro z-score)
    max_steps: int = 20  # episode horizon (commands)
    recipe: int = 1  # tw-cooking --recipe
    take: int = 1  # tw-cooking --take
    go: int = 1  # tw-cooking --go (1, 6, 9 or 12 rooms)
    train_games: int = 12  # training games: seeds 0..train_games-1
    heldout_games: int = 12  # held-out games: seeds games.HELDOUT_SEED_OFFSET + 0..heldout_games-1 (0: no evaluation)
    eval_every: int = 10  # updates between held-out evaluations (and after the last update)
    eval_episodes: int = 4  # episodes per held-out game per evaluation
    drop_examine: bool = True  # leave examine/look/inventory out of the choices (they never change the state)
    vocab: int = 4096  # hashed word vocabulary
    max_tokens: int = 64  # observation words read by the policy
    embed: int = 32  # word embedding width
    hidden: int = 64  # GRU and scorer width
    lr: float = 3e-3  # Adam learning rate
    epochs: int = 4  # PPO epochs over each batch
    grad_clip: float = 1.0  # global gradient-norm clip
    beta: float | None = None  # micro-stream weight; None: the arm's (CCAPO-DEFAULT-3 for ccapo, 0 otherwise)
    sigma_min: float = DEFAULTS["sigma_min"]  # micro z-score std floor (CCAPO-DEFAULT-3)
    clip_eps: float = DEFAULTS["clip_eps"]  # PPO clip (CCAPO-DEFAULT-4)
    beta_kl: float = DEFAULTS["beta_kl"]  # KL weight to the reference policy (CCAPO-DEFAULT-4)
    r_terminal: float = DEFAULTS["r_terminal"]  # success reward (CCAPO-DEFAULT-1)
    r_penalty: float = DEFAULTS["r_penalty"]  # per-step cost (CCAPO-DEFAULT-1)
    v_rate: float = DEFAULTS["v_rate"]  # V-bar moving-average rate (CCAPO-DEFAULT-4)
    gigpo_gamma: float = 0.95  # GiGPO step-return discount (gigpo arm only)
    gigpo_omega: float = 1.0  # GiGPO step-advantage weight (gigpo arm only)
    seed: int = 0  # seeds game choice and sampling (not the games themselves), and the initialisation unless init_seed
    init_seed: int | None = None  # seeds the network initialisation only (the "initial model"); None: seed
    device: str = "cpu"  # torch device of the policy, the sampling and the advantages
    dtype: str = "float32"  # dtype of the policy and the update (float32, float64, bfloat16)
    checkpoint_every: int = 10  # updates between checkpoints (the last update is always saved)
    games_dir: str = "~/.cache/rlconform/textworld"  # cache of generated games (deterministic by seed)

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {sorted(ARMS)}, got {self.arm!r}")
        if self.beta is None:
            self.beta = ARMS[self.arm]

    def game_spec(self) -> GameSpec:
        return GameSpec(recipe=self.recipe, take=self.take, go=self.go)


def score_params() -> dict:
    return {"alpha_smooth": DEFAULTS["alpha_smooth"], "distance_exponent": DEFAULTS["distance_exponent"],
            "lam": DEFAULTS["lam"], "eps": DEFAULTS["eps"]}


class Texts:
    """Distinct strings of a batch, each given an id once; encoded as one padded token tensor."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))

    def tokens(self, tok: Tokenizer, device) -> torch.Tensor:
        return tok.batch(list(self.ids), device)


def _pad(rows: list[list[int]], fill: int, device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [fill] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def rollout(policy: TextPolicy, tok: Tokenizer, envs: list[TextWorldEnv], cfg: Config, gen: torch.Generator,
            device) -> dict:
    """One episode per env, all stepped together; commands sampled on ``device`` in one call per step."""
    B, H = len(envs), cfg.max_steps
    obs_t, cmd_t = Texts(), Texts()
    obs_id = [[0] * H for _ in range(B)]  # host-side ids; become tensors once, after the loop
    cmd_ids = [[[0] for _ in range(H)] for _ in range(B)]
    act = [[0] * H for _ in range(B)]
    anchors, fps, states = [[] for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)]
    for e in envs:
        e.reset()
    for t in range(H):
        live = [i for i, e in enumerate(envs) if not e.done]
        if not live:
            break
        step_obs, step_cmds = Texts(), Texts()
        texts = [envs[i].observation() for i in live]
        o_rows = [step_obs(o) for o in texts]
        cands = [envs[i].admissible(cfg.drop_examine) for i in live]
        c_rows = [[step_cmds(c) for c in cs] for cs in cands]
        c_idx = _pad(c_rows, 0, device)
        legal = _pad([[1] * len(r) for r in c_rows], 0, device).bool()
        with torch.no_grad():
            lp = policy(step_obs.tokens(tok, device), step_cmds.tokens(tok, device),
                        torch.tensor(o_rows, device=device), c_idx, legal)
            pick = torch.multinomial(lp.exp(), 1, generator=gen).squeeze(1).tolist()  # one host sync per step
        for j, i in enumerate(live):
            cmd = cands[j][pick[j]]
            fp = fingerprint(cmd, domain=DOMAIN)  # CCAPO-FP-1, CCAPO-FP-3
            anchors[i].append(anchor(envs[i].location(), fps[i][-1] if fps[i] else None))  # CCAPO-ANCHOR-1
            fps[i].append(fp)
            states[i].append(envs[i].state_key())
            obs_id[i][t] = obs_t(texts[j])
            cmd_ids[i][t] = [cmd_t(c) for c in cands[j]]
            act[i][t] = pick[j]
            envs[i].step(cmd)
    K = max(len(c) for row in cmd_ids for c in row)
    steps = torch.tensor([e.t for e in envs], device=device)
    mask = torch.arange(H, device=device) < steps[:, None]
    return {"obs_tokens": obs_t.tokens(tok, device), "cmd_tokens": cmd_t.tokens(tok, device),
            "obs_idx": torch.tensor(obs_id, device=device),
            "cmd_idx": torch.tensor([[c + [0] * (K - len(c)) for c in row] for row in cmd_ids], device=device),
            "legal": torch.tensor([[[1] * len(c) + [0] * (K - len(c)) for c in row] for row in cmd_ids],
                                  device=device).bool(),  # padding steps keep slot 0 legal: finite log-probs
            "act": torch.tensor(act, device=device), "mask": mask, "steps": steps,
            "success": torch.tensor([e.won for e in envs], device=device),
            "score_frac": torch.tensor([e.score / max(e.max_score, 1) for e in envs], device=device),
            "anchors": anchors, "fps": fps, "states": states}


def anchor_groups(batch: dict, group_size: int, H: int) -> tuple[torch.Tensor, int]:
    """GiGPO anchor-state group id of every step: same game (episode group) and same world state."""
    ids: dict[tuple[int, str], int] = {}
    rows = [[ids.setdefault((i // group_size, s), len(ids)) for s in st] + [0] * (H - len(st))
            for i, st in enumerate(batch["states"])]
    return torch.tensor(rows, dtype=torch.long), len(ids)


def advantages(batch: dict, store, cfg: Config, device) -> tuple[torch.Tensor, dict]:
    """The arm's advantage [B, H] on ``device``, from the STDB as it stood before this batch."""
    H, mask = cfg.max_steps, batch["mask"]
    sc = stdb_steps(batch["anchors"], batch["fps"], store, H, device, score_params())  # on the device
    r_tau = macro_return(batch["success"], batch["steps"], r_terminal=cfg.r_terminal,
                         r_penalty=cfg.r_penalty)  # CCAPO-R-1 (N_step counts loops: CCAPO-LOOP-2)
    a_macro = macro_advantage(r_tau.view(-1, cfg.group_size)).view(-1)  # CCAPO-MACRO-1, CCAPO-MACRO-2
    if cfg.arm == "gigpo":
        r_step = gigpo.step_rewards(batch["success"], batch["steps"], H, r_terminal=cfg.r_terminal,
                                    r_penalty=cfg.r_penalty)  # GiGPO step reward; sums to R_tau (CCAPO-R-1)
        g_step = gigpo.discounted_returns(r_step, gamma=cfg.gigpo_gamma)  # GiGPO step return (no CCAPO clause)
        groups, n_groups = anchor_groups(batch, cfg.group_size, H)
        a_step = gigpo.anchor_group_advantage(g_step, groups.to(device), mask,
                                              n_groups=n_groups)  # GiGPO anchor-state z-score (no CCAPO clause)
        a_total = fuse_advantages(a_macro, a_step, beta=cfg.gigpo_omega)  # CCAPO-FUSE-1's sum = GiGPO's A_E + w A_S
    else:
        r_micro = micro_reward(sc["q"], sc["edge_seen"], sc["loops"])  # CCAPO-MICRO-1, CCAPO-LOOP-2
        raw = micro_raw_advantage(r_micro, sc["v_bar"], sc["anchor_seen"])  # CCAPO-MICRO-2
        a_micro = micro_advantage(raw, sigma_min=cfg.sigma_min, valid=mask)  # CCAPO-MICRO-3
        a_total = fuse_advantages(a_macro, a_micro, beta=cfg.beta)  # CCAPO-FUSE-1 (beta = 0: GRPO)
    stats = {"r_tau_mean": r_tau.mean(), "stdb_hit_rate": sc["edge_seen"][mask].float().mean(),
             "loop_rate": sc["loops"][mask].float().mean()}
    return a_total.to(resolve_dtype(cfg.dtype)), stats


def log_probs(policy: TextPolicy, batch: dict) -> torch.Tensor:
    """log pi(a_t | o_t) [B, H] of the taken commands, re-scored over each step's admissible set."""
    lp = policy(batch["obs_tokens"], batch["cmd_tokens"], batch["obs_idx"], batch["cmd_idx"], batch["legal"])
    return lp.gather(-1, batch["act"][..., None]).squeeze(-1)


def ppo_update(policy, ref, opt, batch, adv, cfg: Config) -> dict:
    """``cfg.epochs`` clipped steps on the whole batch; the last epoch's losses and KLs, and ``grad_norm``:
    the largest gradient norm of the update's epochs, before clipping (a spike shows in the log)."""
    with torch.no_grad():
        logp_ref = log_probs(ref, batch)
        logp_old = log_probs(policy, batch)  # recomputed on the update's batching: ratio = 1 on epoch 1
    params, norms = list(policy.parameters()), []
    for _ in range(cfg.epochs):
        out = policy_loss(log_probs(policy, batch), logp_old, logp_ref, adv, batch["mask"], clip_eps=cfg.clip_eps,
                          beta_kl=cfg.beta_kl)  # CCAPO-PPO-1, CCAPO-PPO-2
        norms.append(clipped_step(opt, out["loss"], params, cfg.grad_clip))
    return {**{k: v.detach() for k, v in out.items()}, "grad_norm": torch.stack(norms).max()}


def episode_stats(batch: dict) -> dict:
    return {"success_rate": batch["success"].float().mean(), "mean_steps": batch["steps"].float().mean(),
            "score_frac": batch["score_frac"].float().mean()}


def evaluate(policy, tok, envs, store, cfg: Config, update: int, device) -> dict:
    """Held-out episodes; the STDB is read (hit rate) but never written."""
    gen = torch.Generator(device=device).manual_seed(1_000_003 * (cfg.seed + 1) + update)  # leaves training RNG alone
    stats: dict = {}
    for _ in range(cfg.eval_episodes):
        batch = rollout(policy, tok, envs, cfg, gen, device)
        sc = stdb_steps(batch["anchors"], batch["fps"], store, cfg.max_steps, device, score_params())
        ep = {**episode_stats(batch), "stdb_hit_rate": sc["edge_seen"][batch["mask"]].float().mean()}
        for k, v in ep.items():
            stats[k] = stats.get(k, 0.0) + v.to(torch.float64) / cfg.eval_episodes  # device scalars until the end
    return host_floats(stats)


def initial_policy(cfg: Config, device) -> TextPolicy:
    """The policy as initialised by ``cfg.init_seed`` (``cfg.seed`` when None), whatever RL seed the run has.

    With an ``init_seed`` the weights are drawn inside a forked RNG, so the initial model and the RL seed's
    draws (game choice, sampling, evaluation) vary independently; None keeps the old single-seed runs.
    """
    if cfg.init_seed is None:
        return TextPolicy(cfg.vocab, cfg.embed, cfg.hidden).to(device, resolve_dtype(cfg.dtype))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.init_seed)
        policy = TextPolicy(cfg.vocab, cfg.embed, cfg.hidden)
    return policy.to(device, resolve_dtype(cfg.dtype))


def run_identity(cfg: Config) -> dict:
    """The config a resume must match: no horizon and no device (``--resume --updates N`` may extend a run,
    elsewhere); no ``init_seed`` when unset, so runs made before it existed still resume."""
    ident = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("updates", "device")}
    if ident["init_seed"] is None:
        del ident["init_seed"]
    return ident


def _cpu(state):
    """A state dict with every tensor on the CPU, so a checkpoint loads on any machine."""
    return {k: _cpu(v) if isinstance(v, dict) else v.cpu() if isinstance(v, torch.Tensor) else v
            for k, v in state.items()}


def train(cfg: Config, out: str, *, resume: bool = False) -> list[dict]:
    device = torch.device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # small matrices: thread hand-offs cost more than they save
    run = RunDir(out, family="ccapo-textworld", config=run_identity(cfg), resume=resume)
    seed_everything(cfg.seed)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    pick = torch.Generator().manual_seed(cfg.seed)  # which games each update plays
    train_paths, heldout_paths = train_and_heldout(cfg.game_spec(), cfg.train_games, cfg.heldout_games,
                                                   Path(cfg.games_dir).expanduser())
    # one env per (game, group member), made on first use and reset per episode (starting a game costs ~0.1 s)
    pool: dict[int, list[TextWorldEnv]] = {}
    heldout = [TextWorldEnv(p, cfg.max_steps) for p in heldout_paths]
    tok = Tokenizer(cfg.vocab, cfg.max_tokens)
    policy = initial_policy(cfg, device)
    ref = copy.deepcopy(policy).requires_grad_(False)  # pi_ref: the initial policy (CCAPO-PPO-2)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    store = sqlite_store(run.path / "stdb.sqlite", v_rate=cfg.v_rate, **score_params())
    start = 0
    ckpt = run.load() if resume else None
    if ckpt is not None:
        policy.load_state_dict(ckpt["policy"])  # load_state_dict copies onto the model's device
        ref.load_state_dict(ckpt["ref"])
        opt.load_state_dict(ckpt["opt"])  # Adam moves its moments to the parameters' device
        if ckpt.get("gen_device", "cpu") == device.type:
            gen.set_state(ckpt["gen"])
        else:  # a generator state does not carry across device types: a fresh stream, seeded by the update
            gen.manual_seed(cfg.seed * 1_000_003 + ckpt["update"])
        pick.set_state(ckpt["pick"])
        store.restore(ckpt["stdb"])  # the STDB rolls back with the policy: no double-counted batch
        start = ckpt["update"] + 1
    with contextlib.ExitStack() as guards:  # input guards on for the first batch only
        for update in progress(range(start, cfg.updates), total=cfg.updates, initial=start, desc=f"tw-{cfg.arm}"):
            games = torch.randperm(len(train_paths), generator=pick, device="cpu")[: cfg.prompts].tolist()  # host choice
            for g in games:  # a game's group of envs is started once and reused (not built anew for setdefault)
                if g not in pool:
                    pool[g] = [TextWorldEnv(train_paths[g], cfg.max_steps) for _ in range(cfg.group_size)]
            envs = [e for g in games for e in pool[g]]
            batch = rollout(policy, tok, envs, cfg, gen, device)
            adv, stats = advantages(batch, store, cfg, device)
            diag = ppo_update(policy, ref, opt, batch, adv, cfg)
            if update == start:  # the first batch passed every input guard: the rest run without them
                guards.enter_context(_checks.validation(False))
            for i, ok in enumerate(batch["success"].tolist()):  # one transaction per episode (CCAPO-STDB-1..4, -6)
                store.update({"anchors": batch["anchors"][i], "fingerprints": batch["fps"][i], "success": ok})
            rec = {**episode_stats(batch), **stats, **{k: diag[k] for k in ("approx_kl", "kl_ref", "clip_fraction", "loss", "grad_norm")}}
            run.log(update=update, split="train", arm=cfg.arm, **host_floats(rec))  # one transfer per update
            last = update == cfg.updates - 1
            if heldout and ((update + 1) % cfg.eval_every == 0 or last):
                run.log(update=update, split="heldout", arm=cfg.arm,
                        **evaluate(policy, tok, heldout, store, cfg, update, device))
            if (update + 1) % cfg.checkpoint_every == 0 or last:
                run.save(_cpu({"update": update, "policy": policy.state_dict(), "ref": ref.state_dict(),
                               "opt": opt.state_dict(), "gen": gen.get_state(), "gen_device": device.type,
                               "pick": pick.get_state(),
                               "stdb": store.snapshot()}))
    store.close()
    for e in [e for envs in pool.values() for e in envs] + heldout:
        e.close()
    return run.metrics()


def _run_one(job: tuple[dict, str, bool]) -> str:
    cfg, out, resume = job
    train(Config(**cfg), out, resume=resume)
    return out


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlconform train ccapo-textworld", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory; each arm and seed gets <out>/<arm>-s<seed>")
    p.add_argument("--resume", action="store_true", help="continue every run from its checkpoint")
    p.add_argument("--arms", default="ccapo,grpo,gigpo", help=f"comma-separated, from {sorted(ARMS)}")
    p.add_argument("--seeds", default="0", help="comma-separated training seeds")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes, one torch thread each)")
    for f in dataclasses.fields(Config):
        if f.name in ("arm", "seed", "beta", "init_seed"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, "bool"):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)
    p.add_argument("--beta", type=float, default=None, help="override the micro-stream weight of every arm")
    p.add_argument("--init-seed", type=int, default=None,
                   help="seed of the network initialisation only (default: each run's --seeds value)")
    a = vars(p.parse_args(argv))
    arms, seeds = a.pop("arms").split(","), [int(s) for s in a.pop("seeds").split(",")]
    out, resume, jobs = Path(a.pop("out")), a.pop("resume"), a.pop("jobs")
    runs = [({**a, "arm": arm, "seed": s}, str(out / f"{arm}-s{s}"), resume) for arm in arms for s in seeds]
    for cfg, _, _ in runs:
        Config(**cfg)  # reject a bad arm before any run starts
    if jobs > 1:  # an executor, not a Pool: a worker killed from outside raises instead of hanging the wait
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
            list(ex.map(_run_one, runs))
    else:
        for r in runs:
            _run_one(r)
    for cfg, path, _ in runs:
        recs = [json.loads(ln) for ln in (Path(path) / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        evals = [r for r in recs if r["split"] == "heldout"] or [r for r in recs if r["split"] == "train"]
        last = evals[-1]
        print(f"{cfg['arm']:>6} seed {cfg['seed']}: {last['split']} success={last['success_rate']:.2f} "
              f"steps={last['mean_steps']:.1f} score={last['score_frac']:.2f} stdb_hit={last['stdb_hit_rate']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
