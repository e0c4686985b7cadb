"""Discrete max-entropy SAC on the char-level POMDP (seed 000 V2, the loop of §8), sized for a CPU.

``rlconform train sac --out RUN [--preset cpu|full] [--updates N] [--resume] [--seed S] [--device cpu] [--dtype float32]``

Per update: the B environments write one character each (the policy samples from the masked
softmax; with probability ``teacher_ratio`` the teacher overrides and the step goes to the demo
buffer), then one gradient step on a ρ : (1-ρ) agent/demo batch: Top-p soft backup and TD target
under no_grad, twin-Q Huber loss (+ CQL), expected policy loss (full legal set or Top-p) + BC on demo
rows, temperature step on log α, soft target update. Every math line calls a pure function of
``reference_impl.sac`` and cites its clause. Held-out (later-January) text is evaluated every
``eval_every`` updates: next-character top-1/top-3 hits, 4-gram coverage and paragraph
consistency of free generation, against a unigram-frequency baseline (the figures of SAC-GATE-3
and SAC-GATE-7; the multi-run gates -2 and -8 come from ``rlconform.golive``).

Everything after the corpus is read lives on ``--device``: the passages, the environments (legal
masks, rewards, teacher), the replay buffers and their draws, action sampling, the update (in
``--dtype``) and the evaluation. The loop reads back to the host once per update, after the gradient
step (its diagnostics and the step's counts), and never loops over rows in Python. The input guards
check the first gradient step's batch and are then switched off (each guard reads a value back).
Data-parallel: ``torchrun --nproc_per_node N -m reference_impl.sac.trainer ...``: each process writes its own
``env.n_envs`` passages into its own buffers (per-rank seed), DDP averages the critic and policy
gradients of the per-process batches, the temperature step sees the entropies of all ranks, and
rank 0 evaluates and writes metrics and checkpoints (which hold every rank's buffers).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import time

import numpy as np
import torch

from reference_impl import _checks
from reference_impl.common import RunDir, progress, seed_everything
from reference_impl.common import distributed as ddp
from reference_impl.sac.corpus import UNK, Corpus, load_corpus
from reference_impl.sac.data import dagger_teacher_ratio, mix_counts
from reference_impl.sac.defaults import defaults
from reference_impl.sac.env import CharEnv, EnvConfig, compliance_mask
from reference_impl.sac.masking import masked_softmax
from reference_impl.sac.nets import PolicyNet, TwinQ
from reference_impl.sac.quality import attested_share, ngram_set, paragraph_consistency
from reference_impl.sac.reward import ngram_coverage
from reference_impl.sac.replay import Replay, sample_mixed
from reference_impl.sac.graphed import CapturedUpdate

D = defaults()


@dataclasses.dataclass
class Config:
    seed: int = 0  # seeds torch, numpy, random and the env/replay generator
    threads: int = 1  # torch CPU threads (multi-threaded small reductions are slower on a shared 2-core box)
    vocab_size: int = 2000  # |Σ| cap: the most frequent training characters (+ <pad>, <unk>, <eos>; 98.7% of the text)
    max_lines: int | None = 8000  # paragraphs read from the People's Daily corpus (train + held-out); None: all
    heldout_frac: float = 0.1  # the last share of those paragraphs is the out-of-domain set
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)  # POMDP and reward settings
    d_model: int = 64  # embedding width d (spec default 128, scaled down for CPU)
    gru_hidden: int = 128  # width of c_t (spec's GRU hidden 256, scaled down for CPU)
    encoder: str = "conv"  # window encoder of §4: "conv" (whole-window kernel, CPU default) or "gru"
    batch_size: int = 256  # training batch B per process (spec default 2048, scaled down for CPU)
    buffer_capacity: int = 100_000  # capacity of each of the agent and demo buffers
    learning_starts: int = 1024  # transitions stored before the first gradient step
    lr_pi: float = 3e-3  # policy Adam step (spec 3e-4; raised for runs of about a thousand updates)
    lr_q: float = 3e-3  # critic Adam step (spec 3e-4; raised for runs of about a thousand updates)
    lr_alpha: float = D["lr_alpha"]  # temperature step η_α
    alpha_optimizer: str = "adam"  # optimiser of log α on temperature_loss: "adam", or "sgd" (= SAC-TEMP-1's step)
    init_alpha: float = 0.2  # α at the start
    alpha_min: float = D["alpha_min"]  # α clamp, low end
    alpha_max: float = D["alpha_max"]  # α clamp, high end
    tau: float = D["tau"]  # target-network soft-update rate
    gamma: float = D["gamma"]  # discount
    top_p: float = D["top_p"]  # Top-p mass of the backup (and of option B)
    kappa: float = D["kappa"]  # entropy target factor: H_tgt = κ log|A(s)|
    rho: float = 0.5  # agent share of a batch (spec 0.75; 0.5 doubles the demo rows of a short run)
    lambda_bc: float = 1.0  # BC weight on demo rows (spec 0.1; 1.0 so a few CPU minutes suffice, see docs/results/sac)
    use_cql: bool = True  # add the CQL regulariser to the critic loss
    lambda_cql: float = D["lambda_cql"]  # CQL weight
    policy_use_topp: bool = False  # policy loss over the Top-p set (option B) instead of the full legal set (A)
    huber_delta: float = 1.0  # Huber threshold of the critic loss
    grad_clip: float = D["grad_clip"]  # max gradient norm of each optimiser step
    dagger_start: float = D["dagger_start"]  # teacher ratio at step 0
    dagger_end: float = D["dagger_end"]  # teacher ratio after the horizon
    dagger_horizon: int = 400_000  # env steps of the linear anneal (spec 200k; 1200 updates x 256 envs end at ratio 0.31)
    eval_every: int = 100  # updates between held-out evaluations (and one at the end)
    eval_positions: int = 2048  # held-out positions for the top-1/top-3 next-character hit rates
    eval_passages: int = 32  # held-out passages written freely for the coverage metric
    eval_len: int = 64  # characters written per evaluation passage
    eval_ngram: int = 4  # n of the evaluation coverage (the §10 gate uses 4-grams)
    kpi_rows: int | None = 32  # batch rows whose Top-p coverage is logged (None: every row)
    ckpt_every: int = 250  # updates between checkpoints (and one at the end)
    dtype: str = "float32"  # dtype of the networks, log α and the update tensors (float32, float64, bfloat16)
    cuda_graph: bool = True  # on one CUDA GPU, replay the update from a CUDA graph (graphed.py); eager elsewhere
    compile: bool = False  # torch.compile the update's fused heads (fewer kernels; a GPU's opt-in, step.py)


# Presets: "cpu" is the Config above (a few CPU minutes); "full" is the document's V2 sizes (§9) for a
# GPU: d 128, GRU 256, batch 2048, lr 3e-4, rho 0.75, lambda_BC 0.1, DAgger over 200k steps, PopArt
# beta 1e-3, on the whole corpus with every character in the vocabulary. The window m = 16 and the
# counts of envs/evaluation rows are ours (§2 leaves m open). ``--set`` still overrides any field.
PRESETS: dict[str, dict] = {
    "cpu": {},
    "full": {"d_model": 128, "gru_hidden": 256, "encoder": "gru", "batch_size": 2048, "lr_pi": 3e-4, "lr_q": 3e-4,
             "rho": 0.75, "lambda_bc": 0.1, "dagger_horizon": 200_000, "vocab_size": 8000, "max_lines": None,
             "buffer_capacity": 2_000_000, "learning_starts": 16_384, "eval_every": 2000, "ckpt_every": 2000,
             "eval_positions": 16_384, "eval_passages": 256, "env.popart_beta": 1e-3, "env.n_envs": 1024,
             "env.history": 16},
}
PRESET_UPDATES = {"cpu": 1200, "full": 200_000}  # default --updates of each preset

# ---------------------------------------------------------------------------------------------- setup
# SGD at rate η_α on temperature_loss (SAC-TEMP-2) moves log α by η_α·E[H_tgt − H]: SAC-TEMP-1's step
ALPHA_OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}


def build(cfg: Config, d: ddp.Dist, dtype: torch.dtype = torch.float32):
    device = d.device
    corpus = load_corpus(vocab_size=cfg.vocab_size, max_lines=cfg.max_lines, heldout_frac=cfg.heldout_frac)
    seed_everything(cfg.seed)  # network initialisation: the same on every rank
    seed = ddp.rank_seed(cfg.seed, d.rank)
    g = torch.Generator(device).manual_seed(seed)  # passages, teacher coins, replay draws of this rank
    g_act = torch.Generator(device).manual_seed(_stream_seed(seed, 1))  # action samples: a stream of their own
    V, enc = corpus.vocab_size, {"kind": cfg.encoder, "window": cfg.env.history}
    policy = PolicyNet(V, cfg.d_model, cfg.gru_hidden, **enc).to(device, dtype)
    critic = TwinQ(V, cfg.d_model, cfg.gru_hidden, **enc).to(device, dtype)
    target = TwinQ(V, cfg.d_model, cfg.gru_hidden, **enc).to(device, dtype).requires_grad_(False)
    target.load_state_dict(critic.state_dict())  # \bar φ_i ← φ_i
    log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, dtype=dtype, requires_grad=True)
    s = {
        "corpus": corpus, "g": g, "g_act": g_act, "seed": seed, "dist": d, "dtype": dtype,
        "policy": policy, "critic": critic, "target": target, "log_alpha": log_alpha,
        "ddp_policy": ddp.wrap(policy, d), "ddp_critic": ddp.wrap(critic, d),  # gradients averaged over ranks
        "opt_pi": torch.optim.Adam(policy.parameters(), lr=cfg.lr_pi),
        "opt_q": torch.optim.Adam(critic.parameters(), lr=cfg.lr_q),
        "opt_alpha": ALPHA_OPTIMIZERS[cfg.alpha_optimizer]([log_alpha], lr=cfg.lr_alpha),
        "env": (env := CharEnv(corpus, corpus.train.to(device), cfg.env, generator=g)),
        "legal": device_legal_mask(env, device),
        "agent_buf": Replay(cfg.buffer_capacity, cfg.env.history, device),
        "demo_buf": Replay(cfg.buffer_capacity, cfg.env.history, device),
        "count": {"env_steps": 0, "illegal": 0, "episodes": 0, "early": 0, "teacher": 0, "relabeled": 0,
                  "rejected": 0, "agent_steps": 0, "agent_bonus_hits": 0, "seconds": 0.0},
    }
    return s


def _stream_seed(seed: int, stream: int) -> int:
    """A 32-bit seed for another random stream of a rank: generators on one device type seeded alike draw
    alike (and a CPU generator keeps only 32 bits of its seed)."""
    return int(np.random.SeedSequence(seed, spawn_key=(stream,)).generate_state(1)[0])


def device_legal_mask(env: CharEnv, device: torch.device):
    """obs [N, m] on ``device`` -> A(s) [N, V] built there from the env's compliance tables (copied once
    if the env lives elsewhere), so no mask crosses the bus per update (SAC-LEGAL-1, SAC-LEGAL-2)."""
    return functools.partial(compliance_mask, allowed=env.allowed.to(device), punct=env.punct.to(device),
                             whitelist=env.whitelist.to(device), min_legal=env.cfg.min_legal)


def _state(s: dict, update: int) -> dict | None:
    """The checkpoint (on rank 0; None elsewhere): shared networks once, rank-local state per rank."""
    local = {"env": s["env"].state_dict(), "agent_buf": s["agent_buf"].state_dict(),
             "demo_buf": s["demo_buf"].state_dict(), "count": dict(s["count"]), "rng": ddp.rng_state(s["g"], s["g_act"])}
    ranks = ddp.gather_to_writer(local, s["dist"])
    if ranks is None:
        return None
    return {"update": update, "policy": s["policy"].state_dict(), "critic": s["critic"].state_dict(),
            "target": s["target"].state_dict(), "log_alpha": s["log_alpha"].detach().clone(),
            "opt_pi": s["opt_pi"].state_dict(), "opt_q": s["opt_q"].state_dict(), "opt_alpha": s["opt_alpha"].state_dict(),
            "ranks": ranks}


def _restore(s: dict, ck: dict) -> int:
    """Load a checkpoint saved on any device; this rank takes its own env, buffers and random state."""
    local = ddp.per_rank(ck["ranks"], s["dist"])
    for k in ("policy", "critic", "target", "opt_pi", "opt_q", "opt_alpha"):
        s[k].load_state_dict(ck[k])
    for k in ("env", "agent_buf", "demo_buf"):
        s[k].load_state_dict(local[k])
    with torch.no_grad():
        s["log_alpha"].copy_(ck["log_alpha"])
    s["count"].update(local["count"])
    ddp.set_rng_state(local["rng"], s["g"], s["g_act"], reseed=s["seed"])
    s["env"].reset()  # episodes in flight at the checkpoint restart on fresh passages
    return int(ck["update"])


# ---------------------------------------------------------------------------------------------- one SAC update
def make_update(s: dict, cfg: Config) -> CapturedUpdate:
    """The checked ``update_step`` bound to this run's networks and optimisers: replayed from a CUDA
    graph on one GPU (``cfg.cuda_graph``), run eagerly elsewhere (the same phases).

    ``s["ddp_critic"]``/``s["ddp_policy"]`` (DDP under torchrun, else the bare networks) average the
    critic and policy gradients over ranks; ``all_rows`` hands the temperature step the entropies of
    every rank's rows, so log α stays the same everywhere (a graph is then not captured).
    Built after a resume, as loading an optimiser's state resets its flags.
    """
    opts = {"q": s["opt_q"], "pi": s["opt_pi"], "alpha": s["opt_alpha"]}
    d = s["dist"]
    return CapturedUpdate(s["ddp_policy"], s["ddp_critic"], s["target"], s["log_alpha"], opts,
                          capture=cfg.cuda_graph, gamma=cfg.gamma, top_p=cfg.top_p, kappa=cfg.kappa,
                          tau=cfg.tau, lambda_bc=cfg.lambda_bc, lambda_cql=cfg.lambda_cql, use_cql=cfg.use_cql,
                          policy_use_topp=cfg.policy_use_topp, huber_delta=cfg.huber_delta, grad_clip=cfg.grad_clip,
                          alpha_min=cfg.alpha_min, alpha_max=cfg.alpha_max, kpi_rows=cfg.kpi_rows, compile=cfg.compile,
                          all_rows=functools.partial(ddp.gather_cat, d=d) if d.enabled else None)  # SAC-STEP-1


def sac_update(s: dict, batch: dict, cfg: Config) -> dict:
    """One gradient step of §8 on a merged agent/demo batch (``s["update"]``, from :func:`make_update`);
    returns the diagnostics."""
    dev, dt = s["log_alpha"].device, s["log_alpha"].dtype
    b = {k: v.to(dev, dt) if v.is_floating_point() else v.to(dev) for k, v in batch.items()}
    b["legal_mask"], b["next_legal_mask"] = s["legal"](b["obs"]), s["legal"](b["next_obs"])  # built on the device
    return s["update"](b)  # SAC-STEP-1, SAC-GRAD-1


# ---------------------------------------------------------------------------------------------- evaluation
def _scores_policy(policy, dev):
    def score(obs: torch.Tensor) -> torch.Tensor:
        return policy(obs.to(dev)).float()  # the evaluation runs in float32 or wider
    return score


def _scores_unigram(corpus: Corpus):
    def score(obs: torch.Tensor) -> torch.Tensor:
        return corpus.counts.to(obs.device).float().log1p().expand(len(obs), -1)
    return score


@torch.no_grad()
def evaluate(score, corpus: Corpus, env_cfg: EnvConfig, cfg: Config, *, device: torch.device | str = "cpu") -> dict:
    """Held-out next-character hits (teacher-forced windows) and free-generation 4-gram coverage.

    ``score(obs) -> logits [N, V]`` on ``device``, where the whole evaluation runs; the legal mask and
    the ε-clipped masked softmax of the policy apply to both the policy and the unigram baseline.
    """
    held, m, dev = corpus.heldout.to(device), env_cfg.history, torch.device(device)
    g = torch.Generator(dev).manual_seed(1234)  # the same positions and passages at every evaluation
    pos = torch.randint(m, len(held), (cfg.eval_positions,), generator=g, device=dev)
    obs = held[pos[:, None] - m + torch.arange(m, device=dev)]
    ev_cfg = dataclasses.replace(env_cfg, n_envs=cfg.eval_passages, horizon=cfg.eval_len)
    ev = CharEnv(corpus, held, ev_cfg, generator=g, reward=False)
    pi = masked_softmax(score(obs), ev.legal_mask(obs))  # SAC-MASK-1, SAC-MASK-2
    top = pi.topk(3, dim=-1).indices
    tgt = held[pos]
    hit1 = (top[:, 0] == tgt) & (tgt != UNK)
    hit3 = (top == tgt[:, None]).any(-1) & (tgt != UNK)
    starts = torch.randint(m, len(held) - cfg.eval_len, (cfg.eval_passages,), generator=g, device=dev)
    o = ev.reset(starts=starts)
    tail_dirty = torch.zeros(cfg.eval_passages, dtype=torch.bool, device=dev)
    for _ in range(cfg.eval_len):
        legal = ev.legal_mask()
        a = masked_softmax(score(o), legal).argmax(-1)  # greedy writing
        o, _, done, info = ev.step(a, legal=legal)
        tail_dirty = info["garble"] | info["illegal"]
        if bool(done.all()):
            break
    agent_text, ref_text = ev.texts()  # one read back to the host
    cov = [ngram_coverage(a, r, n=cfg.eval_ngram, window=cfg.eval_len)
           for a, r in zip(agent_text, ref_text)]  # SAC-COV-1 with n = 4 on held-out text
    written = [a[len(r) - t:] for a, r, t in zip(agent_text, ref_text, ev.t.tolist())]  # without the prime
    cons = [paragraph_consistency(text, corpus.lexicon) for text in written]  # our score of SAC-GATE-7
    attested = ngram_set(corpus.decode(corpus.heldout), cfg.eval_ngram)  # every 4-gram of the held-out split
    att = [attested_share(text, attested, cfg.eval_ngram) for text in written]  # a diagnostic, not gated
    hits = torch.stack([hit1.float().mean(), hit3.float().mean(), tail_dirty.sum().float()]).tolist()
    return {"top1_hit": hits[0], "top3_hit": hits[1], "coverage": sum(cov) / len(cov),
            "consistency": sum(cons) / len(cons), "heldout_4gram_share": sum(att) / len(att),
            "dirty_tail": int(hits[2]), "sample": written[0]}


# ---------------------------------------------------------------------------------------------- the loop
GATE3_FIGURES = ("top1_hit", "top3_hit", "coverage")  # §10: each must beat the baseline by 10 points
# the agent_bonus_hits count is the agent's own lexicon bigrams (SAC-BIGRAM-1), for bigram_hit_rate
COUNTS = ("illegal", "episodes", "early", "teacher", "relabeled", "rejected", "agent_steps", "agent_bonus_hits")


def sample_actions(pi: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One action per row of ``pi`` [N, V] by inverse CDF, in float64 (the ε-clipped entries keep their
    mass). ``torch.multinomial`` draws from the same distribution but reads ``pi`` back to validate it."""
    cdf = pi.double().cumsum(-1)
    u = torch.rand(len(pi), 1, generator=generator, device=pi.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_max(pi.shape[-1] - 1)


def _step_stats(info: dict, done: torch.Tensor, env: CharEnv, reward: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """The step's :data:`COUNTS` and the PopArt panel, as one float64 vector on the device: read once,
    after the update, when the read waits for nothing."""
    demo = info["is_teacher"]
    counts = torch.stack([info["illegal"].sum(), done.sum(), info["early"].sum(), demo.sum(),
                          info["is_relabeled"].sum(), info["teacher_rejected"].sum(), (~demo).sum(),
                          ((info["bonus"] > 0) & ~demo).sum()])
    names, popart = env.popart_summary(reward)
    return names, torch.cat([counts.double(), popart.double()])


def _eval_record(s: dict, base: dict, baseline: dict, cfg: Config, device: torch.device, t0: float) -> dict:
    """Held-out figures of the current policy, the baseline's, and the smallest gain in points."""
    ev = evaluate(_scores_policy(s["policy"], device), s["corpus"], cfg.env, cfg, device=device)
    gains = [ev[k] - base[k] for k in GATE3_FIGURES]
    return {**ev, **baseline, "ood_gain_pp": 100 * min(gains),  # SAC-GATE-3: the smallest of the three gains
            "consistency_gain_pp": 100 * (ev["consistency"] - base["consistency"]),  # SAC-GATE-7
            "minutes": (time.time() - t0) / 60}


def train(cfg: Config, out: str, *, updates: int, resume: bool = False, device: str = "cpu") -> list[dict]:
    torch.set_num_threads(cfg.threads)
    d = ddp.setup(device)  # one process, or this rank of a torchrun job
    device = d.device
    rd = RunDir(out, family="sac", config=cfg, resume=resume, writer=d.is_writer)
    s = build(cfg, d, ddp.resolve_dtype(cfg.dtype))
    start = _restore(s, ck) if resume and (ck := rd.load()) is not None else 0
    s["update"] = make_update(s, cfg)
    env, corpus, g, cnt = s["env"], s["corpus"], s["g"], s["count"]
    if d.is_writer:  # rank 0 evaluates; the others only train
        base = evaluate(_scores_unigram(corpus), corpus, cfg.env, cfg, device=device)  # unigram-frequency baseline
        baseline = {f"baseline_{k}": base[k] for k in (*GATE3_FIGURES, "consistency", "heldout_4gram_share")}
    obs, B, t0 = env.observe(), cfg.env.n_envs, time.time() - cnt["seconds"]  # minutes carry over a resume
    last, learning, guards_off = {}, False, False
    if start == 0 and d.is_writer:  # the untrained policy: the start of every learning curve
        rec0 = _eval_record(s, base, baseline, cfg, device, t0)
        rec0.pop("sample")
        rd.log(update=0, **rec0)
    with contextlib.ExitStack() as stack:  # holds validation(False) once the first batch has passed; undone on exit
        for update in progress(range(start + 1, updates + 1), total=updates - start, desc="sac", initial=0,
                               disable=None if d.is_writer else True):
            # --- act: the masked, ε-clipped softmax of the policy, sampled; the teacher overrides a share of rows
            ratio = dagger_teacher_ratio(cnt["env_steps"], start=cfg.dagger_start, end=cfg.dagger_end,
                                         horizon=cfg.dagger_horizon)  # SAC-DAGGER-1
            with torch.no_grad():
                legal = env.legal_mask()  # A(s_t), for the policy and the step
                pi = masked_softmax(s["policy"](obs), legal)  # SAC-MASK-1, SAC-MASK-2
                action = sample_actions(pi, s["g_act"])
            teacher = torch.rand(B, generator=g, device=device) < ratio
            next_obs, reward, done, info = env.step(action, teacher, legal=legal)

            # --- dual buffer: teacher steps are demo rows (is_demo = 1), the rest agent rows
            demo = info["is_teacher"]
            tr = {"obs": obs, "action": info["action"], "reward": reward, "next_obs": next_obs, "done": done,
                  "is_demo": demo, "is_relabeled": info["is_relabeled"]}
            s["demo_buf"].add(tr, keep=demo)
            s["agent_buf"].add(tr, keep=~demo)
            stat_names, stats = _step_stats(info, done, env, reward)
            cnt["env_steps"] += B
            obs = env.reset(done)

            # --- learn on a ρ : (1 - ρ) agent/demo batch (every rank has the same number of rows stored);
            # the buffers only grow, so their counts are read only until learning starts
            learning = learning or len(s["agent_buf"]) + len(s["demo_buf"]) >= cfg.learning_starts
            diag = {}
            if learning:
                n_agent, n_demo = mix_counts(cfg.batch_size, rho=cfg.rho)  # SAC-MIX-1
                batch = sample_mixed(s["agent_buf"], s["demo_buf"], n_agent, n_demo, g)
                diag = sac_update(s, batch, cfg)  # reads its diagnostics back: the update's one sync
                if not guards_off:  # the first batch passed every input guard: the hot loop runs without them
                    stack.enter_context(_checks.validation(False))
                    guards_off = True

            # --- the step's counts, read back now that the update has run
            vals = stats.tolist()
            for key, n in zip(COUNTS, vals):
                cnt[key] += int(n)
            tot = ddp.reduce_metrics({k: v for k, v in cnt.items() if k != "seconds"}, d,
                                     total=[k for k in cnt if k != "seconds"])  # counts of all ranks
            rec = {"update": update, "env_steps": tot["env_steps"], "teacher_ratio": ratio,
                   **dict(zip(stat_names, vals[len(COUNTS):])),
                   "illegal_rate": tot["illegal"] / tot["env_steps"],
                   "early_termination_rate": tot["early"] / max(tot["episodes"], 1),
                   "relabel_rate": tot["relabeled"] / max(tot["teacher"], 1),
                   "teacher_reject_rate": tot["rejected"] / max(tot["teacher"] + tot["rejected"], 1),
                   "bigram_hit_rate": tot["agent_bonus_hits"] / max(tot["agent_steps"], 1), **diag}
            rec = ddp.reduce_metrics(rec, d)  # rank means of the float metrics (the rates above are already global)
            if d.is_writer and (update % cfg.eval_every == 0 or update == updates):
                rec.update(_eval_record(s, base, baseline, cfg, device, t0))
                last = {**rec}
                rec.pop("sample")
            rd.log(**rec)
            if update % cfg.ckpt_every == 0 or update == updates:
                cnt["seconds"] = time.time() - t0
                state = _state(s, update)  # a collective: every rank hands over its buffers
                if state is not None:
                    rd.save(state)
    return [last] if last else []


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlconform train sac", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="run directory (config.json, metrics.jsonl, checkpoint.pt)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                   help="cpu: sized for a few CPU minutes (default); full: the V2 sizes of the document, for a GPU")
    p.add_argument("--updates", "--steps", dest="updates", type=int, default=None,
                   help="total updates (one env step of all envs + one gradient step each; default: the preset's)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="device of the networks, sampling and update (cuda: cuda:LOCAL_RANK per process)")
    p.add_argument("--dtype", choices=sorted(ddp.DTYPES), default=None, help="dtype of the networks and the update (float32)")
    p.add_argument("--n-envs", type=int, default=None, help="parallel passages B")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--ckpt-every", type=int, default=None)
    p.add_argument("--no-cql", action="store_true", help="switch the CQL regulariser off (use_cql = False)")
    p.add_argument("--policy-topp", action="store_true", help="policy loss over the Top-p set (option B)")
    p.add_argument("--alpha-optimizer", choices=("adam", "sgd"), default=None)
    p.add_argument("--teacher-mode", choices=("reject", "relabel"), default=None)
    p.add_argument("--dagger-horizon", type=int, default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any Config field (env fields as env.NAME), value parsed as a Python literal")
    a = p.parse_args(argv)
    cfg = apply_overrides(Config(seed=a.seed), [f"{k}={v!r}" for k, v in PRESETS[a.preset].items()])
    for flag, field in (("n_envs", "env.n_envs"), ("batch_size", "batch_size"), ("vocab_size", "vocab_size"),
                        ("eval_every", "eval_every"), ("ckpt_every", "ckpt_every"),
                        ("alpha_optimizer", "alpha_optimizer"), ("teacher_mode", "env.teacher_mode"),
                        ("dagger_horizon", "dagger_horizon"), ("dtype", "dtype")):
        if getattr(a, flag) is not None:
            a.set.append(f"{field}={getattr(a, flag)!r}")
    if a.no_cql:
        a.set.append("use_cql=False")
    if a.policy_topp:
        a.set.append("policy_use_topp=True")
    cfg = apply_overrides(cfg, a.set)
    updates = PRESET_UPDATES[a.preset] if a.updates is None else a.updates
    last = train(cfg, a.out, updates=updates, resume=a.resume, device=a.device)
    ddp.teardown()
    if last:
        r = last[0]
        print(f"update {r['update']}: top1 {r['top1_hit']:.3f} (unigram {r['baseline_top1_hit']:.3f}), "
              f"top3 {r['top3_hit']:.3f} (unigram {r['baseline_top3_hit']:.3f}), 4-gram coverage "
              f"{r['coverage']:.3f} (unigram {r['baseline_coverage']:.3f}), consistency {r['consistency']:.3f} "
              f"(unigram {r['baseline_consistency']:.3f}), alpha {r.get('alpha', float('nan')):.3g}")
        print("sample:", r["sample"].replace("\n", "⏎"))
    return 0


def apply_overrides(cfg: Config, pairs: list[str]) -> Config:
    """``KEY=VALUE`` strings onto the config (``env.KEY`` for the environment's fields)."""
    import ast

    env_kw, kw = {}, {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        try:
            val = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            val = raw
        (env_kw if key.startswith("env.") else kw)[key.removeprefix("env.")] = val
    names = {f.name for f in dataclasses.fields(Config)} | {f"env.{f.name}" for f in dataclasses.fields(EnvConfig)}
    unknown = [k for k in kw if k not in names] + [f"env.{k}" for k in env_kw if f"env.{k}" not in names]
    if unknown:
        raise ValueError(f"unknown config field(s): {', '.join(unknown)}")
    wrong = [f"{prefix}{k}={v!r} (expected {_kind(getattr(obj, k))})"
             for prefix, obj, kv in (("", cfg, kw), ("env.", cfg.env, env_kw)) for k, v in kv.items()
             if not _fits(getattr(obj, k), v, _FIELD_TYPES[type(obj)][k])]
    if wrong:
        raise ValueError(f"config value(s) of the wrong type: {', '.join(wrong)}")
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, **env_kw), **kw)


def _kind(default) -> str:
    return "a number" if type(default) is float else type(default).__name__


_FIELD_TYPES = {c: {f.name: str(f.type) for f in dataclasses.fields(c)} for c in (Config, EnvConfig)}


def _fits(default, value, annotation: str) -> bool:
    """Whether an override may replace a field whose default is ``default``: the same type (an int for a
    float; None where the annotation allows it; anything where the default is None), so
    ``cuda_graph=maybe`` is an error, not a true value."""
    if default is None or (value is None and "None" in annotation):
        return True
    if type(default) is float:
        return type(value) in (int, float)
    return type(value) is type(default)


if __name__ == "__main__":  # torchrun --nproc_per_node N -m reference_impl.sac.trainer --out DIR --updates U
    import sys

    ddp.exit_process(cli(sys.argv[1:]))
