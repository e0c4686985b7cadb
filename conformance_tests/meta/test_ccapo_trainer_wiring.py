"""Wiring of the two CCAPO v4.1 reference trainers: what reaches their update.

The smoke tests (test_ccapo_trainer.py, test_ccapo_textworld_trainer.py) show that
reference_impl/ccapo/trainer.py (key-and-chest world) and reference_impl/ccapo/textworld/trainer.py (tw-cooking
games) run, log and resume. A trainer that attaches advantages to the wrong episode, scores commands over another
admissible set than it sampled from, lets padding into the loss, or folds a batch into the STDB before reading
the STDB for that batch's advantages passes them all. Here each trainer runs two or three updates on a tiny
configuration with spies (pytest's monkeypatch) on its boundaries: the environment (episode start, step), the
sampler (``torch.multinomial``), the STDB store (lookups and writes) and the update entry point
(``ccapo_update``; for TextWorld, ``ppo_update`` and the ``policy_loss`` it calls). What the update received is
then compared with what the environment and the sampler produced, through oracles written here from the spec
(CCAPO-R-1, -MACRO-1/2, -I-1, -C-1, -D-1, -Q-1, -MICRO-1..3, -LOOP-1/2, -FUSE-1, -ANCHOR-1, -STDB-1..5, -PPO-1/2;
the GiGPO arm's formulas from its module docstring), never by calling the trainers' own helpers. Log-probs
are recomputed with the policy network at the parameters recorded at the update's entry.

Each test was shown to fail on hand-made wiring mutants of the trainers (shifted actions, observations after
the step, another admissible set in the update, padding in the mask, advantages of the neighbouring episode,
groups mixed, penalty dropped, stale or post-update log-probs, the STDB folded before the advantages, ...).
"""
from __future__ import annotations

import copy
import dataclasses
import shutil
from collections import defaultdict

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_that
from conformance_tests.meta.run_once import once_per_run
from reference_impl.ccapo import fingerprint
from reference_impl.ccapo import trainer as toy
from reference_impl.ccapo.env import ROOMS, KeyChestEnv

pytestmark = pytest.mark.meta

# ----------------------------------------------------------------------------- spec constants and oracles
R_TERMINAL, R_PENALTY = 10.0, -0.1  # CCAPO-DEFAULT-1
SIGMA_MIN, MACRO_EPS, BETA = 0.1, 1e-8, 0.5  # CCAPO-DEFAULT-3
START = "<START>"  # CCAPO-ANCHOR-1: the anchor's previous action at t = 0
TOY_FP = [f"GOTO({r})" for r in ROOMS] + ["TAKE(key)", "OPEN(chest)"]  # CCAPO-FP-1 of env.ACTIONS, by hand
TOL = 1e-5  # float32 policy and advantages against float64 oracles


@dataclasses.dataclass(eq=False)
class Episode:
    """One episode as the environment saw it."""

    group: object  # the prompt: the layout's identity (toy) or the game file (TextWorld)
    steps: list = dataclasses.field(default_factory=list)  # per step: what the env showed, and the action
    success: bool = False
    n: int = 0  # the env's own step count when the episode ended

    def fps(self, fp_of) -> list[str]:
        return [fp_of(s) for s in self.steps]

    def anchors(self, fp_of) -> list[tuple[str, str]]:
        """CCAPO-ANCHOR-1: (location of s_t, FP(a_{t-1})), START at t = 0."""
        fps = self.fps(fp_of)
        return [(s["loc"], fps[t - 1] if t else START) for t, s in enumerate(self.steps)]


def r_tau(ep: Episode) -> float:
    """CCAPO-R-1 with the env's outcome and step count (loops included, CCAPO-LOOP-2)."""
    return (R_TERMINAL if ep.success else 0.0) + ep.n * R_PENALTY


def zscore(xs: list[float], eps: float) -> list[float]:
    """(x - mean) / (population std + eps); exactly 0 for equal values (CCAPO-MACRO-1, -MACRO-2)."""
    if max(xs) == min(xs):
        return [0.0] * len(xs)
    m = sum(xs) / len(xs)
    sd = (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
    return [(x - m) / (sd + eps) for x in xs]


def macro_oracle(episodes: list[Episode]) -> list[float]:
    """A_macro of every episode: z-score of R_tau over the episodes of its own prompt."""
    groups = defaultdict(list)
    for i, ep in enumerate(episodes):
        groups[ep.group].append(i)
    out = [0.0] * len(episodes)
    for idx in groups.values():
        for i, z in zip(idx, zscore([r_tau(episodes[i]) for i in idx], MACRO_EPS)):
            out[i] = z
    return out


def q_oracle(edge: dict, n_succ_total: int, n_total_global: int) -> float:
    """Q_STDB(E) from the edge's counts (CCAPO-I-1, -C-1, -D-1, -Q-1; alpha_s = 1, eps = 1e-8, 0.5, lambda = 1)."""
    ns, nt = edge["n_succ"], edge["n_total"]
    imp = (ns + 1) / (nt + 2)
    crit = (ns / (nt + 1e-8)) / (n_succ_total / (n_total_global + 1e-8) + 1e-8)
    dist = 1.0 / (edge["d_sum"] / ns + 1) ** 0.5 if ns else 1.0  # no success through E: no distance evidence
    x = imp * (1 + crit) * dist
    return x / (1 + x)


def micro_raw_oracle(state: dict, anchors: list, fps: list[str]) -> list[float]:
    """A_raw per step from the STDB ``state`` (CCAPO-LOOP-1, -MICRO-1, -MICRO-2)."""
    out = []
    for t, (a, f) in enumerate(zip(anchors, fps)):
        loop = (t >= 1 and f == fps[t - 1]) or (t >= 2 and f == fps[t - 2])
        edge = state["edges"].get((*a, f))
        r = q_oracle(edge, state["n_succ_total"], state["n_total_global"]) if edge and not loop else 0.0
        v = state["anchors"].get(tuple(a))
        out.append(r - v["v_bar"] if v is not None else 0.0)
    return out


def micro_oracle(state: dict, episodes: list[Episode], fp_of) -> tuple[list[list[float]], list[float]]:
    """A_micro per step (batch z-score, std floored at sigma_min: CCAPO-MICRO-3) and the raw values."""
    raw = [micro_raw_oracle(state, ep.anchors(fp_of), ep.fps(fp_of)) for ep in episodes]
    flat = [x for r in raw for x in r]
    m = sum(flat) / len(flat)
    d = max((sum((x - m) ** 2 for x in flat) / len(flat)) ** 0.5, SIGMA_MIN)
    return [[(x - m) / d for x in r] for r in raw], flat


def gigpo_oracle(episodes: list[Episode], gamma: float = 0.95, eps: float = 1e-6) -> list[list[float]]:
    """GiGPO step advantage (textworld/gigpo.py's docstring): discounted return of r_t = R_penalty (+ R_terminal
    on a winning last step), z-scored over the steps of the same game taken from the same world state."""
    ret = []
    for ep in episodes:
        g, out = 0.0, []
        for t in reversed(range(ep.n)):
            g = R_PENALTY + (R_TERMINAL if ep.success and t == ep.n - 1 else 0.0) + gamma * g
            out.append(g)
        ret.append(out[::-1])
    groups = defaultdict(list)
    for b, ep in enumerate(episodes):
        for t, s in enumerate(ep.steps):
            groups[(ep.group, s["state"])].append((b, t))
    adv = [[0.0] * ep.n for ep in episodes]
    for members in groups.values():
        vals = [ret[b][t] for b, t in members]
        m = sum(vals) / len(vals)
        sd = (sum((v - m) ** 2 for v in vals) / len(vals)) ** 0.5
        for (b, t), v in zip(members, vals):
            adv[b][t] = (v - m) / (sd + eps)
    return adv


def close(got, want, tol: float = TOL) -> bool:
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return g.shape == w.shape and bool(np.allclose(g, w, rtol=tol, atol=tol))


def params(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- spies
class Recorder:
    """What the environment, the sampler, the store and the update saw, in order."""

    def __init__(self):
        self.batches: list[dict] = []  # per update: episodes (row order), STDB state at its start, draws
        self.updates: list[dict] = []  # per update: what the update entry point received
        self.writes: list[tuple[int, dict]] = []  # (batch, trajectory) per trajectory written to the STDB
        self.events: list[str] = []  # "step", "lookup", "write", "update" in call order
        self.store = None
        self.open = False
        self.losses: list[dict] = []
        self.envs = {"started": set(), "closed": set()}  # TextWorld envs, by id

    def batch(self) -> dict:
        """The batch being played; its first episode opens it with a snapshot of the STDB as it stands."""
        if not self.open:
            self.batches.append({"episodes": [], "pre_state": self.store.snapshot(), "draws": []})
            self.open = True
        return self.batches[-1]

    def step(self, ep: Episode, record: dict) -> None:
        ep.steps.append(record)
        self.events.append("step")
        draws = self.batch()["draws"]
        if not draws:  # a step with no draw before it: check_sampler reports it
            draws.append({"probs": None, "picks": [], "steps": []})
        draws[-1]["steps"].append((ep, len(ep.steps) - 1))

    def write(self, trajectories) -> None:
        self.events.append("write")
        for tr in trajectories:
            self.writes.append((len(self.batches) - 1, {"anchors": [tuple(a) for a in tr["anchors"]],
                                                        "fingerprints": list(tr["fingerprints"]),
                                                        "success": bool(tr["success"])}))


def spy_store(mp, rec: Recorder, module) -> None:
    """The trainer's ``sqlite_store``, returning the real store with its lookups and writes recorded."""
    factory = module.sqlite_store

    def make(*args, **kwargs):
        store = factory(*args, **kwargs)
        rec.store = store
        many, one, lookup, inner = store.update_many, store.update, store.lookup, []

        def update_many(trajectories):
            if not inner:  # update() may delegate here: count its trajectory once
                rec.write(trajectories)
            return many(trajectories)

        def update(trajectory):
            rec.write([trajectory])
            inner.append(1)
            try:
                return one(trajectory)
            finally:
                inner.pop()

        def look(anchors, fps):
            rec.events.append("lookup")
            return lookup(anchors, fps)

        store.update_many, store.update, store.lookup = update_many, update, look
        return store

    mp.setattr(module, "sqlite_store", make)


def spy_sampler(mp, rec: Recorder) -> None:
    """``torch.multinomial``: the probabilities each draw sampled from and what it picked."""
    draw = torch.multinomial

    def multinomial(probs, *args, **kwargs):
        out = draw(probs, *args, **kwargs)
        rec.batch()["draws"].append({"probs": probs.detach().to(torch.float64).clone(),
                                     "picks": out.reshape(-1).tolist(), "steps": []})
        return out

    mp.setattr(torch, "multinomial", multinomial)


def event_pattern(events: list[str]) -> list[str]:
    """Event kinds in order, repeats merged, the update entry left out."""
    out: list[str] = []
    for e in events:
        if e != "update" and (not out or out[-1] != e):
            out.append(e)
    return out


def check_sampler(batch: dict, dist_of, clause: str) -> None:
    """Every step played was drawn by the sampler: a draw of the same call picked that action from a row whose
    probabilities are ``dist_of(step)`` (the pre-update policy over the env's admissible set), 0 elsewhere."""
    n_steps = sum(len(ep.steps) for ep in batch["episodes"])
    drawn = sum(len(d["steps"]) for d in batch["draws"])
    assert_that(drawn == n_steps, clause, (drawn, n_steps), "every env step follows a draw of the sampler")
    for d, draw in enumerate(batch["draws"]):
        assert_that(draw["probs"] is not None and len(draw["picks"]) == len(draw["steps"]), clause,
                    (d, len(draw["picks"]), len(draw["steps"])), "one sampled row per env step of that draw")
        free = list(range(len(draw["picks"])))
        for ep, t in draw["steps"]:
            act, p = ep.steps[t]["action"], dist_of(ep.steps[t])
            hit = [j for j in free if draw["picks"][j] == act and close(draw["probs"][j, :len(p)], p)
                   and not draw["probs"][j, len(p):].any()]
            assert_that(hit, clause, (d, t, act, draw["picks"]),
                        "the action played was sampled from the pre-update policy over the env's admissible set")
            free.remove(hit[0])


def check_stdb_writes(rec: Recorder, fp_of, clause: str) -> None:
    """Each batch's episodes are folded in once each, with their own anchors, fingerprints and outcome, after
    the batch's lookups and before the next batch is played."""
    for k, b in enumerate(rec.batches):
        want = sorted(repr({"anchors": ep.anchors(fp_of), "fingerprints": ep.fps(fp_of), "success": ep.success})
                      for ep in b["episodes"])
        got = sorted(repr(tr) for j, tr in rec.writes if j == k)
        assert_that(got == want, clause, got[:2], f"batch {k}: the STDB gets exactly its episodes, e.g. {want[:2]}")
    pattern = event_pattern(rec.events)
    assert_that(pattern == ["step", "lookup", "write"] * len(rec.batches), "CCAPO-STDB-5", pattern,
                "per batch: play, look every step up (advantages), then fold the batch in")


# ----------------------------------------------------------------------------- the key-and-chest trainer
TOY = dict(updates=3, prompts=3, group_size=4, max_steps=30, epochs=2, minibatch_size=6, checkpoint_every=1000,
           seed=1)


def toy_fp(step: dict) -> str:
    return TOY_FP[step["action"]]


def _train_spied(mp, rec: Recorder, trainer, cfg, out) -> tuple[Recorder, object, list[dict]]:
    """Run ``trainer`` with the store and the sampler spied on too (``mp`` holds its other spies), one update
    per batch played."""
    spy_store(mp, rec, trainer)
    spy_sampler(mp, rec)
    metrics = trainer.train(cfg, str(out))
    assert_that(len(rec.updates) == len(rec.batches) == cfg.updates, "CCAPO-UPDATE-1",
                (len(rec.batches), len(rec.updates)), f"{cfg.updates} batches, one update each")
    return rec, cfg, metrics


def _run_toy(out) -> tuple[Recorder, toy.Config, list[dict]]:
    rec, cfg = Recorder(), toy.Config(**TOY)
    with pytest.MonkeyPatch.context() as mp:
        init, step, update = KeyChestEnv.__init__, KeyChestEnv.step, toy.ccapo_update

        def env_init(self, layout, max_steps):
            init(self, layout, max_steps)
            self._ep = Episode(group=id(layout))  # one layout object per prompt of the batch
            rec.batch()["episodes"].append(self._ep)

        def env_step(self, action):
            rec.step(self._ep, {"obs": self.obs().copy(), "legal": self.legal().copy(), "action": int(action),
                                "loc": ROOMS[self.room]})
            step(self, action)
            self._ep.success, self._ep.n = bool(self.success), self.t

        def ccapo_update(policy, ref, opt, batch, **kwargs):
            rec.events.append("update")
            entry = {"rows": {k: v.detach().clone() for k, v in batch.items()}, "before": params(policy),
                     "ref": params(ref)}
            entry["records"] = update(policy, ref, opt, batch, **kwargs)
            entry["after"] = params(policy)
            rec.updates.append(entry)
            rec.open = False
            return entry["records"]

        mp.setattr(KeyChestEnv, "__init__", env_init)
        mp.setattr(KeyChestEnv, "step", env_step)
        mp.setattr(toy, "ccapo_update", ccapo_update)
        return _train_spied(mp, rec, toy, cfg, out)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    return _run_toy(tmp_path_factory.mktemp("ccapo-wiring") / "run")


def toy_dists(state: dict, cfg, steps: list[dict]) -> list[torch.Tensor]:
    """log pi(.|s) of each step under the policy network at ``state`` (the parameters recorded at the update)."""
    policy = toy.Policy(cfg.hidden)
    policy.load_state_dict(state)
    obs = torch.tensor(np.stack([s["obs"] for s in steps]))
    legal = torch.tensor(np.stack([s["legal"] for s in steps]))
    with torch.no_grad():
        return list(policy(obs, legal).to(torch.float64))


@pytest.mark.clause("CCAPO-UPDATE-1", "CCAPO-PPO-1")
def test_toy_update_rows_are_the_steps_played(toy_run):
    # row b, step t of the update: the observation and admissible mask the env showed before step t of
    # episode b, the action played there, and a mask that is True on exactly the env's N_step real steps
    rec, _, metrics = toy_run
    for k, (b, u) in enumerate(zip(rec.batches, rec.updates)):
        rows, eps = u["rows"], b["episodes"]
        assert_that(rows["action"].shape[0] == len(eps), "CCAPO-UPDATE-1", rows["action"].shape,
                    f"{len(eps)} trajectories")
        for i, ep in enumerate(eps):
            n, H = ep.n, rows["mask"].shape[1]
            assert_that(n == len(ep.steps) and rows["mask"][i].tolist() == [t < n for t in range(H)], "CCAPO-PPO-1",
                        (k, i, rows["mask"][i].tolist(), n), "mask True on the episode's real steps only")
            obs = np.stack([s["obs"] for s in ep.steps])
            legal = np.stack([s["legal"] for s in ep.steps])
            acts = [s["action"] for s in ep.steps]
            assert_that(rows["action"][i, :n].tolist() == acts, "CCAPO-UPDATE-1", (k, i, rows["action"][i, :n]),
                        f"the actions played, in order: {acts}")
            assert_that(np.array_equal(rows["obs"][i, :n].numpy(), obs), "CCAPO-UPDATE-1", (k, i),
                        "each step's observation from before that step")
            assert_that(np.array_equal(rows["legal"][i, :n].numpy(), legal), "CCAPO-UPDATE-1", (k, i),
                        "each step's admissible mask as the env gave it before that step")
        # the log reports the outcomes the env reported
        m = metrics[k]
        assert_that(close(m["success_rate"], np.mean([e.success for e in eps]))
                    and close(m["mean_steps"], np.mean([e.n for e in eps])), "CCAPO-R-1", m,
                    "success_rate and mean_steps of the batch's episodes")


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2", "CCAPO-UPDATE-1")
def test_toy_old_logprobs_are_the_sampling_policys(toy_run):
    rec, cfg, _ = toy_run
    init = rec.updates[0]["before"]
    for k, (b, u) in enumerate(zip(rec.batches, rec.updates)):
        eps = b["episodes"]
        steps = [s for ep in eps for s in ep.steps]
        dists = dict(zip(map(id, steps), toy_dists(u["before"], cfg, steps)))
        check_sampler(b, lambda s: dists[id(s)].exp(), "CCAPO-PPO-1")
        got = [u["rows"]["logp_old"][i, t].item() for i, ep in enumerate(eps) for t in range(ep.n)]
        want = [dists[id(s)][s["action"]].item() for s in steps]
        assert_that(close(got, want), "CCAPO-PPO-1", (k, got[:4]),
                    f"logp_old = log pi_old(a_t|s_t) of the action played, at the pre-update parameters: {want[:4]}")
        first = u["records"][0]
        assert_that(first["approx_kl"] < 1e-6 and first["clip_fraction"] == 0, "CCAPO-PPO-1", first,
                    "ratio 1 on the first minibatch")
        # pi_ref is the initial policy throughout; the update moves the policy it sampled with, and the
        # next batch samples with the moved policy (check_sampler of batch k + 1 at its entry parameters)
        assert_that(same_params(u["ref"], init), "CCAPO-PPO-2", k, "pi_ref = the initial policy at every update")
        assert_that(not same_params(u["after"], u["before"]), "CCAPO-UPDATE-1", u["records"][-1],
                    "the update changes the policy (a non-zero gradient)")
        if k + 1 < len(rec.updates):
            assert_that(same_params(rec.updates[k + 1]["before"], u["after"]), "CCAPO-UPDATE-1", k,
                        "the next update starts from this update's parameters")


@pytest.mark.clause("CCAPO-R-1", "CCAPO-MACRO-1", "CCAPO-MACRO-2", "CCAPO-MICRO-1", "CCAPO-MICRO-2",
                    "CCAPO-MICRO-3", "CCAPO-FUSE-1", "CCAPO-LOOP-1", "CCAPO-LOOP-2")
def test_toy_advantages_belong_to_their_episode_and_group(toy_run):
    # A_total(b, t) = A_macro(b) + beta A_micro(b, t): R_tau from the env's outcome and N_step, z-scored over
    # the episodes of b's own layout; A_micro from the STDB as it stood before the batch, z-scored over the batch
    rec, _, metrics = toy_run
    mixed = micro_hits = 0
    for k, (b, u) in enumerate(zip(rec.batches, rec.updates)):
        eps = b["episodes"]
        macro = macro_oracle(eps)
        micro, raw = micro_oracle(b["pre_state"], eps, toy_fp)
        mixed += any(m != 0 for m in macro)
        micro_hits += sum(x != 0 for x in raw)
        adv = u["rows"]["advantage"]
        for i, ep in enumerate(eps):
            want = [macro[i] + BETA * z for z in micro[i]]
            assert_that(close(adv[i, :ep.n], want), "CCAPO-FUSE-1", (k, i, adv[i, :ep.n].tolist()[:5]),
                        f"A_macro + beta A_micro of this episode's steps: {want[:5]}")
        want_r = np.mean([r_tau(e) for e in eps])
        assert_that(close(metrics[k]["r_tau_mean"], want_r), "CCAPO-R-1", metrics[k]["r_tau_mean"],
                    f"mean R_tau of the batch = {want_r}")
    # the run must exercise both streams, or the comparison above proves little
    assert_that(mixed >= 2 and micro_hits >= 10, "CCAPO-FUSE-1", (mixed, micro_hits),
                "batches whose groups differ in R_tau, and steps whose anchor the STDB has seen")


@pytest.mark.clause("CCAPO-STDB-1", "CCAPO-STDB-2", "CCAPO-STDB-5", "CCAPO-ANCHOR-1")
def test_toy_stdb_folds_in_the_episodes_played_after_their_advantages(toy_run):
    rec, _, _ = toy_run
    check_stdb_writes(rec, toy_fp, "CCAPO-STDB-1")


# ----------------------------------------------------------------------------- the TextWorld trainer
TW = dict(updates=2, prompts=2, group_size=4, max_steps=15, train_games=2, heldout_games=0, epochs=2,
          checkpoint_every=1000, seed=6, device="cpu")  # seed 6: a win in the first batch


@pytest.fixture(scope="module")
def tw_games(tiny_game, tmp_path_factory):
    """A directory with the tiny game (seed 0) and one more of the same settings (seed 1): two prompts."""
    from reference_impl.ccapo.textworld.games import GameSpec, generate

    def build(d):
        for ext in (".json", ".z8"):
            shutil.copy(tiny_game.with_suffix(ext), d / tiny_game.with_suffix(ext).name)
        generate(GameSpec(seed=1), d)
        return d

    return once_per_run(tmp_path_factory, "tw-game-pair", build)


def tw_fp(step: dict) -> str:
    return fingerprint(step["cmd"], domain="textworld")  # the checked pure fingerprinter (CCAPO-FP-1, -FP-3)


def _run_textworld(arm: str, games, out) -> tuple[Recorder, object, list[dict]]:
    from reference_impl.ccapo.textworld import trainer as tw
    from reference_impl.ccapo.textworld.env import TextWorldEnv

    rec, cfg = Recorder(), tw.Config(arm=arm, games_dir=str(games), **TW)
    with pytest.MonkeyPatch.context() as mp:
        init, reset, step, admissible, close_env = (TextWorldEnv.__init__, TextWorldEnv.reset, TextWorldEnv.step,
                                                    TextWorldEnv.admissible, TextWorldEnv.close)
        ppo_update, policy_loss = tw.ppo_update, tw.policy_loss

        def env_init(self, path, max_steps):
            self._in_init = True  # the reset inside __init__ starts no training episode
            init(self, path, max_steps)
            self._in_init = False
            rec.envs["started"].add(id(self))

        def env_close(self):
            rec.envs["closed"].add(id(self))
            close_env(self)

        def env_reset(self):
            reset(self)
            if not self._in_init:
                self._ep = Episode(group=self.path)
                rec.batch()["episodes"].append(self._ep)

        def env_step(self, command):
            adm = admissible(self, cfg.drop_examine)  # the set the policy should choose from
            rec.step(self._ep, {"obs": self.observation(), "adm": adm, "cmd": command, "loc": self.location(),
                                "state": self.state_key(), "action": adm.index(command) if command in adm else -1})
            step(self, command)
            self._ep.success, self._ep.n = self.won, self.t

        def update(policy, ref, opt, batch, adv, cfg_):
            rec.events.append("update")
            entry = {"batch": {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                               for k, v in batch.items()},
                     "adv": adv.detach().clone(), "before": params(policy), "ref": params(ref), "losses": []}
            rec.losses = entry["losses"]
            out = ppo_update(policy, ref, opt, batch, adv, cfg_)
            entry["after"] = params(policy)
            rec.updates.append(entry)
            rec.open = False
            return out

        def loss(logp_new, logp_old, logp_ref, advantages, mask, **kwargs):
            rec.losses.append({"new": logp_new.detach().clone(), "old": logp_old.detach().clone(),
                               "ref": logp_ref.detach().clone(), "adv": advantages.detach().clone(),
                               "mask": torch.as_tensor(mask).clone()})
            return policy_loss(logp_new, logp_old, logp_ref, advantages, mask, **kwargs)

        mp.setattr(TextWorldEnv, "__init__", env_init)
        mp.setattr(TextWorldEnv, "reset", env_reset)
        mp.setattr(TextWorldEnv, "step", env_step)
        mp.setattr(TextWorldEnv, "close", env_close)
        mp.setattr(tw, "ppo_update", update)
        mp.setattr(tw, "policy_loss", loss)
        return _train_spied(mp, rec, tw, cfg, out)


@pytest.fixture(scope="module")
def tw_run(tw_games, tmp_path_factory):
    pytest.importorskip("textworld")
    runs: dict = {}

    def run(arm: str):
        if arm not in runs:
            runs[arm] = _run_textworld(arm, tw_games, tmp_path_factory.mktemp(f"tw-wiring-{arm}"))
        return runs[arm]

    return run


def tw_dists(state: dict, cfg, steps: list[dict]) -> list[torch.Tensor]:
    """log pi(.|o) over each step's admissible commands under the policy network at ``state``, encoded here."""
    from reference_impl.ccapo.textworld.policy import TextPolicy, Tokenizer

    policy = TextPolicy(cfg.vocab, cfg.embed, cfg.hidden)
    policy.load_state_dict(state)
    tok = Tokenizer(cfg.vocab, cfg.max_tokens)
    cmds = sorted({c for s in steps for c in s["adm"]})
    K = max(len(s["adm"]) for s in steps)
    idx = torch.tensor([[cmds.index(c) for c in s["adm"]] + [0] * (K - len(s["adm"])) for s in steps])
    legal = torch.tensor([[k < len(s["adm"]) for k in range(K)] for s in steps])
    with torch.no_grad():
        lp = policy(tok.batch([s["obs"] for s in steps], "cpu"), tok.batch(cmds, "cpu"), torch.arange(len(steps)),
                    idx, legal).to(torch.float64)
    return [lp[i, :len(s["adm"])] for i, s in enumerate(steps)]


def _tokens(table: torch.Tensor, i: int) -> list[int]:
    return [x for x in table[i].tolist() if x != 0]


@pytest.mark.clause("CCAPO-UPDATE-1", "CCAPO-PPO-1")
def test_textworld_update_batch_is_the_commands_played(tw_run):
    # row b, step t of the update batch decodes to the observation the env showed before step t, the env's
    # admissible commands (examine/look/inventory dropped, as configured) in the sampler's order, and the slot of
    # the command played; the mask is True on exactly the env's N_step real steps
    from reference_impl.ccapo.textworld.policy import Tokenizer

    rec, cfg, _ = tw_run("ccapo")
    tok = Tokenizer(cfg.vocab, cfg.max_tokens)
    for k, (b, u) in enumerate(zip(rec.batches, rec.updates)):
        bt = u["batch"]
        H = bt["mask"].shape[1]
        assert_that(bt["act"].shape[0] == len(b["episodes"]), "CCAPO-UPDATE-1", bt["act"].shape, "one row per episode")
        for i, ep in enumerate(b["episodes"]):
            assert_that(ep.n == len(ep.steps) and bt["mask"][i].tolist() == [t < ep.n for t in range(H)],
                        "CCAPO-PPO-1", (k, i, ep.n, bt["mask"][i].tolist()), "mask True on the real steps only")
            for t, s in enumerate(ep.steps):
                where = (k, i, t)
                assert_that(s["action"] >= 0, "CCAPO-UPDATE-1", (where, s["cmd"], s["adm"]),
                            "the command played is one of the admissible commands")
                assert_that(_tokens(bt["obs_tokens"], bt["obs_idx"][i, t]) == tok.ids(s["obs"]), "CCAPO-UPDATE-1",
                            where, f"the observation before the step: {s['obs'][:60]!r}")
                n_legal = int(bt["legal"][i, t].sum())
                slots = [_tokens(bt["cmd_tokens"], c) for c in bt["cmd_idx"][i, t, :n_legal].tolist()]
                assert_that(bt["legal"][i, t, :n_legal].all() and slots == [tok.ids(c) for c in s["adm"]],
                            "CCAPO-UPDATE-1", (where, n_legal, len(s["adm"])),
                            f"the legal slots are the env's admissible commands, in order: {s['adm']}")
                assert_that(int(bt["act"][i, t]) == s["action"], "CCAPO-UPDATE-1", (where, int(bt["act"][i, t])),
                            f"the slot of the command played ({s['cmd']!r} = slot {s['action']})")
        # the policy loss masks the same steps
        for call in u["losses"]:
            assert_that(torch.equal(call["mask"], bt["mask"]), "CCAPO-PPO-1", k, "policy_loss gets the batch's mask")


@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-PPO-2", "CCAPO-UPDATE-1")
def test_textworld_trainer_starts_each_game_group_once_and_closes_every_env(tw_run):
    """A game's group of envs is started once and reused across updates, and the run closes all it started (each
    TextWorld env holds a running game: one built per update and dropped would leak)."""
    rec, cfg, _ = tw_run("ccapo")
    games = {ep.group for b in rec.batches for ep in b["episodes"]}
    assert len(rec.envs["started"]) == cfg.group_size * len(games), (len(rec.envs["started"]), len(games))
    assert rec.envs["closed"] == rec.envs["started"]


def test_textworld_old_logprobs_are_the_sampling_policys(tw_run):
    rec, cfg, _ = tw_run("ccapo")
    init = rec.updates[0]["before"]
    for k, (b, u) in enumerate(zip(rec.batches, rec.updates)):
        eps = b["episodes"]
        steps = [s for ep in eps for s in ep.steps]
        dists = dict(zip(map(id, steps), tw_dists(u["before"], cfg, steps)))
        ref = dict(zip(map(id, steps), tw_dists(u["ref"], cfg, steps)))
        check_sampler(b, lambda s: dists[id(s)].exp(), "CCAPO-PPO-1")
        want_old = [dists[id(s)][s["action"]].item() for s in steps]
        want_ref = [ref[id(s)][s["action"]].item() for s in steps]
        assert_that(len(u["losses"]) == cfg.epochs, "CCAPO-UPDATE-1", len(u["losses"]), f"{cfg.epochs} epochs")
        for e, call in enumerate(u["losses"]):
            old = [call["old"][i, t].item() for i, ep in enumerate(eps) for t in range(ep.n)]
            assert_that(close(old, want_old), "CCAPO-PPO-1", (k, e, old[:4]),
                        f"logp_old = log pi_old(a_t|o_t) of the command played, at the pre-update parameters, "
                        f"in every epoch: {want_old[:4]}")
            got_ref = [call["ref"][i, t].item() for i, ep in enumerate(eps) for t in range(ep.n)]
            assert_that(close(got_ref, want_ref), "CCAPO-PPO-2", (k, e, got_ref[:4]),
                        f"logp_ref of the command played under pi_ref: {want_ref[:4]}")
        first = u["losses"][0]
        m = first["mask"]
        assert_that(torch.equal(first["new"][m], first["old"][m]), "CCAPO-PPO-1", k, "ratio exactly 1 in epoch 1")
        assert_that(same_params(u["ref"], init), "CCAPO-PPO-2", k, "pi_ref = the initial policy at every update")
        assert_that(not same_params(u["after"], u["before"]), "CCAPO-UPDATE-1", k,
                    "the update changes the policy (a non-zero gradient)")
        if k + 1 < len(rec.updates):
            assert_that(same_params(rec.updates[k + 1]["before"], u["after"]), "CCAPO-UPDATE-1", k,
                        "the next update starts from this update's parameters")


@pytest.mark.clause("CCAPO-R-1", "CCAPO-MACRO-1", "CCAPO-MACRO-2", "CCAPO-MICRO-1", "CCAPO-MICRO-2",
                    "CCAPO-MICRO-3", "CCAPO-FUSE-1", "CCAPO-LOOP-1")
@pytest.mark.parametrize("arm", ["ccapo", "grpo", "gigpo"])
def test_textworld_advantages_belong_to_their_episode_and_group(tw_run, arm):
    # ccapo: A_macro + 0.5 A_micro; grpo: A_macro; gigpo: A_macro + 1.0 A_step (anchor-state groups of one game);
    # A_macro from the env's won flag and step count, z-scored over the episodes of the same game
    rec, cfg, _ = tw_run(arm)
    mixed = step_terms = 0
    for k, (b, u) in enumerate(zip(rec.batches, rec.updates)):
        eps = b["episodes"]
        macro = macro_oracle(eps)
        mixed += any(m != 0 for m in macro)
        if arm == "gigpo":
            step_adv = gigpo_oracle(eps)
            step_terms += sum(a != 0 for row in step_adv for a in row)
        else:
            micro, raw = micro_oracle(b["pre_state"], eps, tw_fp)
            step_adv = [[(BETA if arm == "ccapo" else 0.0) * z for z in row] for row in micro]
            step_terms += sum(x != 0 for x in raw)
        for i, ep in enumerate(eps):
            want = [macro[i] + a for a in step_adv[i]]
            got = u["adv"][i, :ep.n]
            assert_that(close(got, want), "CCAPO-FUSE-1", (arm, k, i, got.tolist()[:5]),
                        f"this episode's own advantages: {want[:5]}")
            for call in u["losses"]:
                assert_that(torch.equal(call["adv"][i, :ep.n], u["adv"][i, :ep.n]), "CCAPO-PPO-1", (arm, k, i),
                            "policy_loss gets the advantages the update was given")
    # the run must exercise the macro and the step terms, or the comparison above proves little
    assert_that(mixed >= 2 and step_terms >= 10, "CCAPO-FUSE-1", (mixed, step_terms),
                "batches whose games' episodes differ in R_tau, and steps with a non-zero step term")


@pytest.mark.clause("CCAPO-STDB-1", "CCAPO-STDB-2", "CCAPO-STDB-5", "CCAPO-ANCHOR-1")
def test_textworld_stdb_folds_in_the_episodes_played_after_their_advantages(tw_run):
    rec, _, _ = tw_run("ccapo")
    check_stdb_writes(rec, tw_fp, "CCAPO-STDB-1")
