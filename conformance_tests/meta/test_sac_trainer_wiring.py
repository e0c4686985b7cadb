"""Wiring of the SAC reference trainer (reference_impl/sac/trainer.py): what reaches the buffers and the update.

The smoke tests (test_sac_trainer.py) show that the trainer runs, logs and resumes; the clause tests check
each pure function. Neither sees the loop that connects them, and a trainer can run, log finite numbers and
still learn the wrong thing: store the fresh episode's observation as a terminal step's next_obs, drop the
done flag before the critic target (a bootstrap through terminal states, SAC-TD-1), sample under one legal
mask and update under another (SAC-MASK-1, SAC-LEGAL-1), send teacher rows to the agent buffer (seed 000
§7), mix the batch in another ratio than ρ : (1 − ρ) (SAC-MIX-1), move log α the wrong way (SAC-TEMP-1) or
leave a network without a gradient step.

Each test runs the real ``train`` for a few updates on a tiny configuration and spies on its boundaries
with ``monkeypatch`` (``CharEnv.step``/``reset``, ``Replay.add``, the trainer's ``build``,
``sample_actions``, ``sample_mixed`` and ``make_update``, and the step's ``td_target``), then compares
what the environment produced with what the buffers and the update received. The oracles are written
out here (the compliance rule, the masked softmax, the entropy, the teacher's choice, the mix counts,
the temperature and soft-target steps), never computed by the functions under test. Under
``RLCONFORM_DEVICE=sim`` the trainer runs on the simulated CUDA device; the spies copy to the host.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from conformance_tests import harness, simdevice
from reference_impl.sac import step as sac_step
from reference_impl.sac import trainer
from reference_impl.sac.corpus import EOS, UNK
from reference_impl.sac.env import CharEnv
from reference_impl.sac.replay import FIELDS, Replay

pytestmark = pytest.mark.meta

UPDATES = 8
# Tiny and fast (about a second a run): 8 passages of 4 characters (a done every 4th step), a 16-row batch
# with ρ = 0.7 (11 agent + 5 demo rows: a swapped split is visible), a teacher share annealing 0.6 -> 0.3
# over the run (both buffers fill), learning from the first update, evaluation only at the ends.
TINY = {"vocab_size": 400, "max_lines": 1500, "env.n_envs": 8, "env.horizon": 4, "batch_size": 16,
        "learning_starts": 8, "rho": 0.7, "dagger_start": 0.6, "dagger_end": 0.3, "dagger_horizon": 48,
        "eval_positions": 64, "eval_passages": 4, "eval_len": 8, "eval_every": 1000, "ckpt_every": 1000}


def _h(x):
    """A host copy (the spies record tensors the trainer may change in place or keep on the device)."""
    return None if x is None else x.detach().cpu().clone()


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in module.parameters()])


@dataclasses.dataclass
class Spy:
    """What crossed the trainer's boundaries during one run, on the host, in call order."""
    cfg: trainer.Config
    inject: tuple[int, int] | None = None  # (step, row) that writes <unk> instead of the sampled action
    s: dict | None = None
    steps: list = dataclasses.field(default_factory=list)
    resets: list = dataclasses.field(default_factory=list)
    adds: list = dataclasses.field(default_factory=list)
    samples: list = dataclasses.field(default_factory=list)
    mixes: list = dataclasses.field(default_factory=list)
    updates: list = dataclasses.field(default_factory=list)
    targets: list = dataclasses.field(default_factory=list)
    buffers: dict = dataclasses.field(default_factory=dict)
    metrics: list = dataclasses.field(default_factory=list)

    def is_train_env(self, env) -> bool:  # the evaluation builds CharEnvs of its own: not recorded
        return self.s is not None and env is self.s["env"]


def _install(monkeypatch, spy: Spy) -> None:
    real_build, real_step, real_reset, real_add = trainer.build, CharEnv.step, CharEnv.reset, Replay.add
    real_sample, real_mixed, real_make, real_td = (trainer.sample_actions, trainer.sample_mixed,
                                                   trainer.make_update, sac_step.td_target)

    def build(cfg, d, *a, **kw):
        spy.s = real_build(cfg, d, *a, **kw)
        return spy.s

    def step(self, action, teacher=None, legal=None):
        if not spy.is_train_env(self):
            return real_step(self, action, teacher, legal)
        if spy.inject is not None and len(spy.steps) == spy.inject[0]:  # an illegal action, as an agent row
            action, teacher = action.clone(), teacher.clone()
            action[spy.inject[1]], teacher[spy.inject[1]] = UNK, False
        # before the step: the state acted in and the reference's next character (the teacher's choice)
        rec = {"obs": _h(self.observe()), "ref_next": _h(self.teacher_action()), "action_in": _h(action),
               "teacher_in": _h(teacher), "legal_in": _h(legal)}
        out = real_step(self, action, teacher, legal)
        nxt, reward, done, info = out
        rec.update(next_obs=_h(nxt), reward=_h(reward), done=_h(done), action=_h(info["action"]),
                   is_teacher=_h(info["is_teacher"]), is_relabeled=_h(info["is_relabeled"]))
        spy.steps.append(rec)
        return out

    def reset(self, rows=None, starts=None):
        out = real_reset(self, rows, starts)
        if spy.is_train_env(self):
            spy.resets.append({"rows": _h(rows), "obs": _h(out)})
        return out

    def add(self, batch, keep=None):
        spy.adds.append({"buf": self, "batch": {k: _h(v) for k, v in batch.items()}, "keep": _h(keep)})
        return real_add(self, batch, keep)

    def sample_actions(pi, generator):
        with torch.no_grad():  # the current policy on the env's current state, for the sampling oracle
            logits = spy.s["policy"](spy.s["env"].observe())
        a = real_sample(pi, generator)
        spy.samples.append({"pi": _h(pi), "logits": _h(logits), "obs": _h(spy.s["env"].observe()), "action": _h(a)})
        return a

    def sample_mixed(agent, demo, n_agent, n_demo, generator):
        spy.mixes.append({"n_agent": n_agent, "n_demo": n_demo})
        return real_mixed(agent, demo, n_agent, n_demo, generator)

    def make_update(s, cfg):
        real_update = real_make(s, cfg)

        def update(b):
            with torch.no_grad():  # the policy before its step, for the entropy the temperature step must see
                logits = s["policy"](b["obs"])
            pre = {k: _flat(s[k]) for k in ("policy", "critic", "target")} | {"log_alpha": _h(s["log_alpha"])}
            out = real_update(b)
            post = {k: _flat(s[k]) for k in ("policy", "critic", "target")} | {"log_alpha": _h(s["log_alpha"])}
            spy.updates.append({"batch": {k: _h(v) for k, v in b.items()}, "logits": _h(logits), "pre": pre,
                                "post": post})
            return out

        return update

    def td_target(reward, done, v_next, **kw):
        y = real_td(reward, done, v_next, **kw)
        spy.targets.append({"reward": _h(reward), "done": _h(done), "v_next": _h(v_next), "y": _h(y), **kw})
        return y

    monkeypatch.setattr(trainer, "build", build)
    monkeypatch.setattr(CharEnv, "step", step)
    monkeypatch.setattr(CharEnv, "reset", reset)
    monkeypatch.setattr(Replay, "add", add)
    monkeypatch.setattr(trainer, "sample_actions", sample_actions)
    monkeypatch.setattr(trainer, "sample_mixed", sample_mixed)
    monkeypatch.setattr(trainer, "make_update", make_update)
    monkeypatch.setattr(sac_step, "td_target", td_target)


def _run(tmp_path, monkeypatch, updates: int = UPDATES, inject=None, **overrides) -> Spy:
    """``train`` on :data:`TINY` (plus ``overrides``), spied; on the simulated GPU under ``--device sim``."""
    cfg = trainer.apply_overrides(trainer.Config(), [f"{k}={v!r}" for k, v in {**TINY, **overrides}.items()])
    spy = Spy(cfg, inject)
    _install(monkeypatch, spy)
    device = "cuda" if harness.simulated() else "cpu"
    with simdevice.implementation_call():  # the trainer reads its counts on the host, as it may on a GPU
        trainer.train(cfg, str(tmp_path / "run"), updates=updates, device=device)
        for name in ("agent_buf", "demo_buf"):  # the stored rows, oldest first (the ring never wraps here)
            spy.buffers[name] = spy.s[name].state_dict()["data"]
    spy.metrics = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(spy.steps) == len(spy.samples) == updates and len(spy.updates) == updates
    assert spy.s["log_alpha"].device.type == torch.device(device).type  # it ran where the session asked
    return spy


# ---------------------------------------------------------------------------------------------- oracles
def _legal(spy: Spy, obs: torch.Tensor) -> torch.Tensor:
    """A(s) written out (SAC-LEGAL-1): not blacklisted, not a repeat of a punctuation mark that ends the
    history, plus <eos>. Every row keeps far more than min_legal actions, so the whitelist never applies."""
    c = spy.s["corpus"]
    legal = (~c.blacklist.cpu()).expand(len(obs), -1).clone()
    last = obs[:, -1].long()
    rep = c.punct.cpu()[last]
    legal[rep.nonzero().flatten(), last[rep]] = False
    legal[:, EOS] = True
    assert int(legal.sum(-1).min()) >= spy.cfg.env.min_legal  # SAC-LEGAL-2's fallback is out of play
    return legal


def _masked_probs(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Softmax over the legal set alone, in float64 (SAC-MASK-1 before the ε-clip)."""
    return torch.softmax(logits.double().masked_fill(~legal, -math.inf), -1)


def _teacher_choice(spy: Spy, rec: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(demo row, executed action, relabelled) of each row of a step by SAC-TEACHER-1: an asked-for teacher
    action that the mask forbids is rejected (the agent's sampled action runs, an agent row) or moved to
    the legal id nearest by |i - j|, the lower on a tie (a demo row flagged is_relabeled)."""
    legal = _legal(spy, rec["obs"])
    ref, asked, sampled = rec["ref_next"], rec["teacher_in"], rec["action_in"]
    ok = legal.gather(1, ref[:, None]).squeeze(1)
    if spy.cfg.env.teacher_mode == "reject":
        demo = asked & ok
        return demo, torch.where(demo, ref, sampled), torch.zeros_like(demo)
    ids = torch.arange(legal.shape[1])
    dist = (ids[None] - ref[:, None]).abs().double().masked_fill(~legal, math.inf)
    nearest = dist.argmin(-1)  # the first minimum: the lower id
    return asked, torch.where(asked, torch.where(ok, ref, nearest), sampled), asked & ~ok


def _expected_rows(spy: Spy, demo_buffer: bool) -> dict[str, torch.Tensor]:
    """The transitions a buffer must hold, in order: each step's rows of that kind, with the observation
    acted in, the executed action, and the reward, next observation and done that env.step returned."""
    out = {k: [] for k in FIELDS}
    for rec in spy.steps:
        demo, action, relabeled = _teacher_choice(spy, rec)
        keep = demo if demo_buffer else ~demo
        row = {"obs": rec["obs"], "action": action, "reward": rec["reward"], "next_obs": rec["next_obs"],
               "done": rec["done"], "is_demo": demo, "is_relabeled": relabeled}
        for k in FIELDS:
            out[k].append(row[k][keep])
    return {k: torch.cat(v) for k, v in out.items()}


def _key(row: dict, i: int) -> tuple:
    return (tuple(row["obs"][i].tolist()), int(row["action"][i]), float(row["reward"][i]),
            tuple(row["next_obs"][i].tolist()), bool(row["done"][i]), bool(row["is_demo"][i]))


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("mode", ["reject", "relabel"])
def test_each_buffer_holds_the_env_transitions_of_its_rows_in_order(tmp_path, monkeypatch, mode):
    """obs is the state acted in, next_obs what env.step returned (not the next episode's start), reward
    and done as returned; teacher rows (SAC-TEACHER-1's choice, written out) go to the demo buffer with
    is_demo = 1, the others to the agent buffer; the trainer acts next from the reset of exactly the done rows."""
    spy = _run(tmp_path, monkeypatch, **{"env.teacher_mode": mode})
    for name, demo in (("agent_buf", False), ("demo_buf", True)):
        want, got = _expected_rows(spy, demo), spy.buffers[name]
        assert len(want["action"]) > 0, f"{name}: the run stored nothing there"
        for k in FIELDS:
            assert torch.equal(got[k].to(want[k].dtype), want[k]), f"{name}[{k!r}] is not what the env produced"
    assert len(spy.resets) == len(spy.steps)
    for rec, rst, nxt in zip(spy.steps, spy.resets, spy.steps[1:] + [None]):
        assert torch.equal(rst["rows"].bool(), rec["done"]), "reset() must restart exactly the done rows"
        if nxt is not None:
            assert torch.equal(nxt["obs"], rst["obs"]), "the next action must be taken from the reset observation"
    # not vacuous: terminal rows whose fresh episode starts elsewhere, and (reject) refused teacher coins
    restarted = [~(r["next_obs"] == rst["obs"]).all(-1) & r["done"] for r, rst in zip(spy.steps, spy.resets)]
    assert any(bool(x.any()) for x in restarted)
    demo, _, relabeled = (torch.cat(x) for x in zip(*(_teacher_choice(spy, r) for r in spy.steps)))
    asked = torch.cat([r["teacher_in"] for r in spy.steps])
    assert bool((asked & ~demo).any()) if mode == "reject" else bool(relabeled.any())


def test_an_illegal_step_is_stored_as_terminal_with_the_hard_penalty(tmp_path, monkeypatch):
    """SAC-REWARD-2 through the loop. Only the ε-clip lets the policy draw an illegal action (about 1e-8 a
    step), so the spy injects one (row 0 of the third step writes <unk>): its transition must reach the
    agent buffer as terminal with reward exactly −λ_ill, and the row must restart before its next action."""
    spy = _run(tmp_path, monkeypatch, inject=(2, 0))
    rec, rst = spy.steps[2], spy.resets[2]
    assert int(rec["action"][0]) == UNK and bool(rec["done"][0])  # the injection took, and ended the episode
    assert bool(rst["rows"][0]) and torch.equal(spy.steps[3]["obs"][0], rst["obs"][0])
    want, got = _expected_rows(spy, demo_buffer=False), spy.buffers["agent_buf"]
    for k in FIELDS:
        assert torch.equal(got[k].to(want[k].dtype), want[k]), f"agent_buf[{k!r}] is not what the env produced"
    hit = (got["action"] == UNK).nonzero().flatten()
    assert len(hit) == 1, "the illegal step is not stored once in the agent buffer"
    assert bool(got["done"][hit[0]]), "an illegal step must be stored as terminal"
    assert float(got["reward"][hit[0]]) == -spy.cfg.env.lambda_ill


def test_actions_are_sampled_from_the_masked_softmax_of_the_current_policy(tmp_path, monkeypatch):
    """The sampling distribution is the ε-clipped masked softmax (SAC-MASK-1/2) of the policy as it is after
    the previous update, on the env's current state; the mask handed to env.step is A(s_t); every sampled
    action is legal, and it is the action the env is asked to run."""
    spy = _run(tmp_path, monkeypatch)
    for t, (smp, rec) in enumerate(zip(spy.samples, spy.steps)):
        legal = _legal(spy, smp["obs"])
        assert torch.equal(rec["legal_in"], legal), f"step {t}: env.step got another mask than A(s_t)"
        want = _masked_probs(smp["logits"], legal)
        assert torch.allclose(smp["pi"].double()[legal], want[legal], rtol=1e-4, atol=1e-7), f"step {t}: pi"
        assert float(smp["pi"][~legal].max()) <= 1.01e-8, f"step {t}: illegal actions carry probability"
        assert bool(legal.gather(1, smp["action"][:, None]).all()), f"step {t}: an illegal action was sampled"
        assert torch.equal(rec["action_in"], smp["action"]), f"step {t}: env.step got other actions"


def test_update_batches_are_stored_transitions_and_the_target_stops_at_done(tmp_path, monkeypatch):
    """Every row handed to the update is a transition the env produced (done included, unchanged), and the
    critic target of SAC-TD-1 gets that done: y = r on terminal rows, y = r + γ V(s') elsewhere."""
    spy = _run(tmp_path, monkeypatch)
    seen = {}
    for demo in (False, True):
        rows = _expected_rows(spy, demo)
        seen.update((_key(rows, i), True) for i in range(len(rows["action"])))
    done_rows = 0
    for u, (upd, tgt) in enumerate(zip(spy.updates, spy.targets)):
        b = upd["batch"]
        unknown = [i for i in range(len(b["action"])) if _key(b, i) not in seen]
        assert not unknown, f"update {u}: batch rows {unknown} are no transition of the env"
        assert torch.equal(tgt["done"].bool(), b["done"].bool()), f"update {u}: td_target got another done"
        assert torch.equal(tgt["reward"], b["reward"]), f"update {u}: td_target got another reward"
        d = b["done"].bool()
        assert torch.equal(tgt["y"][d], b["reward"][d]), f"update {u}: a terminal row bootstraps"
        boot = b["reward"][~d] + tgt["gamma"] * tgt["v_next"][~d]
        assert torch.allclose(tgt["y"][~d], boot, rtol=1e-5, atol=1e-6), f"update {u}: y != r + γ V"
        done_rows += int(d.sum())
    assert len(spy.targets) == len(spy.updates) and done_rows > 0  # terminal rows did reach the update


def test_update_masks_are_the_legal_sets_of_obs_and_next_obs(tmp_path, monkeypatch):
    """The update recomputes A(s) for each row's obs (the mask the policy sampled under: A(s_t) of the
    step that stored it) and A(s') for its next_obs, not the other way round."""
    spy = _run(tmp_path, monkeypatch)
    differ = 0
    for u, upd in enumerate(spy.updates):
        b = upd["batch"]
        legal, nxt = _legal(spy, b["obs"]), _legal(spy, b["next_obs"])
        assert torch.equal(b["legal_mask"], legal), f"update {u}: legal_mask is not A(obs)"
        assert torch.equal(b["next_legal_mask"], nxt), f"update {u}: next_legal_mask is not A(next_obs)"
        differ += int((legal != nxt).any(-1).sum())
    assert differ > 0  # rows whose two masks differ: a swap would show
    sampled = {tuple(r["obs"][i].tolist()): r["legal_in"][i] for r in spy.steps for i in range(len(r["obs"]))}
    for upd in spy.updates:  # the mask at sampling time and at update time, row by row
        b = upd["batch"]
        for i in range(len(b["obs"])):
            assert torch.equal(b["legal_mask"][i], sampled[tuple(b["obs"][i].tolist())])


def test_batches_mix_agent_and_demo_rows_as_rho_asks(tmp_path, monkeypatch):
    """SAC-MIX-1: each batch holds ⌊ρB + ½⌋ agent rows (is_demo = 0) and the rest demo rows, agent rows first."""
    spy = _run(tmp_path, monkeypatch)
    B, rho = spy.cfg.batch_size, spy.cfg.rho
    n_agent = math.floor(rho * B + 0.5)
    assert (n_agent, B - n_agent) == (11, 5)  # ρ = 0.7, B = 16: a swapped or ceil'd split is visible
    for u, (mix, upd) in enumerate(zip(spy.mixes, spy.updates)):
        assert (mix["n_agent"], mix["n_demo"]) == (n_agent, B - n_agent), f"update {u}"
        want = torch.arange(B) >= n_agent  # both buffers hold rows from the first update on
        assert torch.equal(upd["batch"]["is_demo"].bool(), want), f"update {u}: agent/demo rows out of place"


def test_the_teacher_share_follows_the_dagger_anneal_over_env_steps(tmp_path, monkeypatch):
    """SAC-DAGGER-1 over env steps (B per update): the logged ratio anneals 0.95 -> 0.75 over 48 steps, and
    the coins that ask for the teacher come up at about that rate, not at 1 − ratio (64 coins, mean 0.83:
    the band is five standard deviations wide on each side)."""
    spy = _run(tmp_path, monkeypatch, dagger_start=0.95, dagger_end=0.75)
    c, B = spy.cfg, spy.cfg.env.n_envs
    recs = [r for r in spy.metrics if r["update"] > 0 and "teacher_ratio" in r]
    assert [r["update"] for r in recs] == list(range(1, UPDATES + 1))
    for r in recs:
        steps = B * (r["update"] - 1)
        want = c.dagger_start + (c.dagger_end - c.dagger_start) * min(steps / c.dagger_horizon, 1.0)
        assert r["teacher_ratio"] == pytest.approx(want, abs=1e-12), f"update {r['update']}"
    asked = torch.stack([rec["teacher_in"] for rec in spy.steps]).float().mean()
    assert 0.6 < float(asked) < 1.0


def test_temperature_moves_by_eta_times_the_entropy_gap_of_the_pre_step_policy(tmp_path, monkeypatch):
    """With the SGD optimiser on log α the step is SAC-TEMP-1's: Δ log α = η_α · mean(κ log|A(s)| − H), H the
    entropy over A(s) of the policy before its step (SAC-ENT-1/2, SAC-STEP-1): a deficit raises α."""
    spy = _run(tmp_path, monkeypatch, alpha_optimizer="sgd", lr_alpha=0.05)
    c = spy.cfg
    for u, upd in enumerate(spy.updates):
        b = upd["batch"]
        legal = _legal(spy, b["obs"])
        p = _masked_probs(upd["logits"], legal)
        H = -torch.where(legal, p * p.clamp_min(1e-300).log(), torch.zeros_like(p)).sum(-1)
        gap = (c.kappa * legal.sum(-1).double().log() - H).mean()
        pre, post = float(upd["pre"]["log_alpha"]), float(upd["post"]["log_alpha"])
        assert math.log(c.alpha_min) < post < math.log(c.alpha_max)  # the clamp did not act
        assert post - pre == pytest.approx(c.lr_alpha * float(gap), rel=1e-3, abs=1e-6), f"update {u}"
    assert all(abs(float(u["post"]["log_alpha"] - u["pre"]["log_alpha"])) > 1e-4 for u in spy.updates)


def test_every_update_steps_both_networks_and_soft_updates_the_target(tmp_path, monkeypatch):
    """Each update moves the policy and the critics (no loss without a gradient, no optimiser on the wrong
    network); the target starts as the critic (SAC-TARGET-2) and then follows φ̄ ← τφ + (1 − τ)φ̄
    (SAC-TARGET-1) with the critic after its step."""
    spy = _run(tmp_path, monkeypatch)
    tau = spy.cfg.tau
    assert torch.equal(spy.updates[0]["pre"]["target"], spy.updates[0]["pre"]["critic"])
    for u, upd in enumerate(spy.updates):
        pre, post = upd["pre"], upd["post"]
        for net in ("policy", "critic"):
            assert not torch.equal(pre[net], post[net]), f"update {u}: the {net} did not move"
        want = tau * post["critic"].double() + (1 - tau) * pre["target"].double()
        assert torch.allclose(post["target"].double(), want, rtol=1e-5, atol=1e-6), f"update {u}: target"
