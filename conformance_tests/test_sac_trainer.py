"""Meta smoke tests of the bundled SAC environment and trainer (reference_impl/sac/env.py, trainer.py).

They check our own POMDP and loop, not a third-party implementation: the observation never holds
the reference, masks are legal, the illegal hard boundary ends an episode, and a two-update run
writes the metrics the gates read and resumes where it stopped.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from reference_impl.sac.corpus import EOS, PAD, UNK, load_corpus
from reference_impl.sac.env import CharEnv, EnvConfig

pytestmark = pytest.mark.meta

SMALL = dict(vocab_size=400, max_lines=1500)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(**SMALL)


def _env(corpus, **kw):
    cfg = dataclasses.replace(EnvConfig(n_envs=4, horizon=10, history=6), **kw)
    return CharEnv(corpus, corpus.train, cfg, generator=torch.Generator().manual_seed(0))


def _legal_sample(env, g):
    legal = env.legal_mask()
    return torch.multinomial(legal.float(), 1, generator=g).squeeze(1)


def test_observation_is_only_the_agents_own_characters(corpus):
    g = torch.Generator().manual_seed(1)
    env_a, env_b = _env(corpus, prime=False), _env(corpus, prime=False)
    env_b.reset(starts=torch.tensor([50, 900, 4000, 7000]))  # other references, same actions
    obs_a, obs_b = env_a.observe(), env_b.observe()
    assert bool((obs_a == PAD).all()) and bool((obs_b == PAD).all())
    written = []
    for _ in range(8):
        a = _legal_sample(env_a, g)
        a = torch.where(env_b.legal_mask().gather(1, a[:, None]).squeeze(1), a, torch.full_like(a, EOS))
        written.append(a)
        obs_a, *_ = env_a.step(a)
        obs_b, *_ = env_b.step(a)
        hist = torch.cat([torch.full((4, 6), PAD), torch.stack(written, 1)], 1)[:, -6:]
        assert torch.equal(obs_a, hist) and torch.equal(obs_b, hist)  # own characters, nothing else


def test_primed_observation_holds_no_future_reference(corpus):
    env = _env(corpus, prime=True)
    starts = torch.tensor([100, 200, 300, 400])
    obs = env.reset(starts=starts)
    assert torch.equal(obs, corpus.train[starts[:, None] - 6 + torch.arange(6)])  # past text only
    a = torch.full((4,), EOS)
    obs, *_ = env.step(a)
    assert torch.equal(obs[:, -1], a) and torch.equal(obs[:, :-1], corpus.train[starts[:, None] - 5 + torch.arange(5)])


def test_masks_are_legal(corpus):
    env = _env(corpus)
    comma = corpus.index["，"]
    hist = torch.full((2, 6), corpus.index["的"])
    hist[1, -1] = comma
    legal = env.legal_mask(hist)
    assert bool(legal[:, EOS].all())
    assert not bool(legal[:, PAD].any()) and not bool(legal[:, UNK].any())
    assert bool(legal[0, comma]) and not bool(legal[1, comma])  # no repeated punctuation
    g = torch.Generator().manual_seed(2)
    for _ in range(6):
        _, _, done, info = env.step(_legal_sample(env, g))
        assert not bool(info["illegal"].any())
        env.reset(done)


def test_illegal_action_ends_the_episode_with_exactly_minus_lambda_ill(corpus):
    env = _env(corpus, illegal_done=True)
    a = _legal_sample(env, torch.Generator().manual_seed(3))
    a[1] = UNK
    _, r, done, info = env.step(a)
    assert bool(done[1]) and bool(info["early"][1]) and float(r[1]) == -env.cfg.lambda_ill
    assert not bool(done[0])
    env_soft = _env(corpus, illegal_done=False)
    _, r2, done2, info2 = env_soft.step(a)
    assert not bool(done2[1]) and bool(info2["illegal"][1])


def test_teacher_writes_the_reference_next_character(corpus):
    env = _env(corpus)
    nxt = env.teacher_action()
    legal = env.legal_mask().gather(1, nxt[:, None]).squeeze(1)
    _, _, _, info = env.step(torch.full((4,), EOS), torch.ones(4, dtype=torch.bool))
    assert torch.equal(info["is_teacher"], legal)
    assert torch.equal(info["action"][legal], nxt[legal])


TINY = ["--set", "vocab_size=400", "--set", "max_lines=1500", "--set", "env.n_envs=8", "--set", "env.horizon=6",
        "--set", "batch_size=16", "--set", "learning_starts=8", "--set", "eval_positions=64",
        "--set", "eval_passages=4", "--set", "eval_len=8", "--set", "eval_every=1", "--set", "ckpt_every=1"]
KEYS = {"update", "critic_loss", "policy_loss", "alpha", "entropy", "target_entropy", "top_p_coverage",
        "illegal_rate", "early_termination_rate", "coverage", "top1_hit", "top3_hit", "bigram_hit_rate",
        "teacher_ratio", "relabel_rate", "popart_cov_mu", "popart_cov_sigma", "popart_nce_mu", "popart_nce_sigma"}


def test_two_update_smoke_run_writes_metrics_and_resumes(tmp_path):
    from reference_impl.sac.trainer import cli
    from rlconform.gate import evaluate

    out = tmp_path / "run"
    assert cli(["--out", str(out), "--updates", "2", *TINY]) == 0
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in recs] == [0, 1, 2]  # 0: the untrained policy
    missing = KEYS - set(recs[-1])
    assert not missing, f"metrics lack {sorted(missing)}"
    assert all(v == v for r in recs for v in r.values() if isinstance(v, float))  # no NaN
    verdicts = {r.clause.id: r.verdict for r in evaluate(recs, "sac")}
    for gate in ("SAC-GATE-1", "SAC-GATE-4", "SAC-GATE-5", "SAC-GATE-6", "SAC-TOPP-4"):
        assert verdicts[gate] != "missing", gate
    with pytest.raises(FileExistsError):
        cli(["--out", str(out), "--updates", "2", *TINY])  # no silent overwrite
    assert cli(["--out", str(out), "--updates", "3", "--resume", *TINY]) == 0
    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in recs] == [0, 1, 2, 3]
