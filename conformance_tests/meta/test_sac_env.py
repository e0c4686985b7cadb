"""The SAC trainer's environment (reference_impl/sac/env.py), the leak-free char-level POMDP of seed 000 §2, on a
small corpus: the observation is only the agent's own characters, masks are legal, the illegal hard boundary
ends an episode with exactly -lambda_ill, the teacher writes the reference's next character, and the
trainer's device-side mask is the env's. Our own fixture, not clause tests.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from reference_impl.sac.corpus import EOS, PAD, UNK, load_corpus
from reference_impl.sac.env import CharEnv, EnvConfig
from reference_impl.sac.trainer import device_legal_mask

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


def test_device_side_legal_mask_equals_the_env_mask(corpus):

    env = _env(corpus)
    g = torch.Generator().manual_seed(4)
    hist = torch.randint(0, corpus.vocab_size, (64, 6), generator=g)
    hist[::3, -1] = corpus.index["，"]  # rows that end in punctuation: the repeat rule applies
    for dev in ("cpu", "meta"):
        got = device_legal_mask(env, torch.device(dev))(hist.to(dev))
        assert got.device.type == dev and got.shape == (64, corpus.vocab_size)
    assert torch.equal(device_legal_mask(env, torch.device("cpu"))(hist), env.legal_mask(hist))
    # independent of both: the compliance rule written out per row
    for row, h in enumerate(hist.tolist()):
        want = ~corpus.blacklist.clone()
        if bool(corpus.punct[h[-1]]):
            want[h[-1]] = False
        want[EOS] = True
        assert int(want.sum()) >= env.cfg.min_legal  # so the whitelist fallback does not apply here
        assert torch.equal(env.legal_mask(hist[row:row + 1])[0], want)


def test_reset_restarts_only_the_rows_asked_and_primes_them_with_the_past(corpus):
    env = _env(corpus, prime=True)
    env.reset(starts=torch.tensor([100, 200, 300, 400]))
    for _ in range(3):
        env.step(torch.full((4,), EOS))
    before = {k: getattr(env, k).clone() for k in ("hist", "ref", "prompt", "t", "agent_win", "ref_win")}
    rows = torch.tensor([False, True, False, True])
    obs = env.reset(rows, starts=torch.tensor([0, 600, 0, 800]))
    src = corpus.train
    for r, start in ((1, 600), (3, 800)):
        assert torch.equal(obs[r], src[start - 6:start]) and torch.equal(env.ref[r], src[start:start + 10])
        assert int(env.t[r]) == 0 and torch.equal(env.prompt[r], src[start - 6:start])
    for r in (0, 2):
        for k, v in before.items():
            assert torch.equal(getattr(env, k)[r], v[r]), f"{k} of a row that did not restart changed"
    want = torch.stack([before["ref"][0, 3], src[600], before["ref"][2, 3], src[800]])
    assert torch.equal(env.teacher_action(), want), "restarted rows read their new passage from its start"


def _text(corpus, ids) -> str:
    """Ids as the env's texts spell them: <unk> as U+FFFD, <eos> as a newline, <pad> left out."""
    return "".join({UNK: "\ufffd", EOS: "\n"}.get(i, corpus.chars[i]) for i in ids.tolist() if i != PAD)


def test_texts_are_the_prime_and_what_was_written_since(corpus):
    env = _env(corpus, prime=True)
    starts = torch.tensor([100, 200, 300, 400])
    env.reset(starts=starts)
    written = []
    for t in range(3):
        a = env.teacher_action()  # the reference's own next characters: legal here
        if t == 2:
            a[0] = UNK  # an illegal <unk> still reaches the text (it ends that row's episode)
        written.append(a)
        env.step(a)
    agent, ref = env.texts()
    for r, s in enumerate(starts.tolist()):
        prime = _text(corpus, corpus.train[s - 6:s])
        assert ref[r] == prime + _text(corpus, corpus.train[s:s + 3])
        assert agent[r] == prime + _text(corpus, torch.stack(written, 1)[r])
    assert agent[0].endswith("\ufffd")
    unprimed = _env(corpus, prime=False)
    unprimed.reset(starts=starts)
    unprimed.step(torch.full((4,), EOS))
    assert unprimed.texts() == ([_text(corpus, torch.tensor([EOS]))] * 4, [_text(corpus, corpus.train[s:s + 1])
                                                                          for s in starts.tolist()])


def test_the_episode_ends_at_the_horizon_and_the_teacher_stays_on_the_last_character(corpus):
    env = _env(corpus, horizon=3)
    for t in range(1, 4):
        _, _, done, info = env.step(torch.full((4,), EOS))
        assert bool(done.all()) == (t == 3) and not bool(info["early"].any())
    assert torch.equal(env.teacher_action(), env.ref[:, 2]), "past the horizon the teacher reads the last reference"


def test_the_reward_state_round_trips_on_the_host(corpus):
    env = _env(corpus)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        env.step(_legal_sample(env, g))
    state = env.state_dict()
    assert all(t.device.type == "cpu" for t in (state["queue"], *state["popart"]["cov"]))
    names, vals = env.popart_summary(torch.ones(4))
    assert names == ["popart_cov_mu", "popart_cov_sigma", "popart_nce_mu", "popart_nce_sigma", "reward_mean"]
    mu, var = env.popart["cov"]
    assert float(vals[0]) == pytest.approx(float(mu.mean()))
    assert float(vals[1]) == pytest.approx(float(var.sqrt().mean())) and float(vals[-1]) == 1.0
    assert env.popart_stats()["popart_nce_mu"] == pytest.approx(float(env.popart["nce"][0].mean()))
    other = _env(corpus)
    other.load_state_dict(state)
    assert torch.equal(other.queue, env.queue)
    assert all(torch.equal(a, b) for k in ("cov", "nce") for a, b in zip(other.popart[k], env.popart[k]))
    assert all(torch.equal(a, b) for a, b in zip(other.f.parameters(), env.f.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(other.f_bar.parameters(), env.f_bar.parameters()))
    moments = [(other.f_opt.state[p], env.f_opt.state[q]) for p, q in zip(other.f.parameters(), env.f.parameters())]
    assert moments and all(torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["step"], b["step"])
                           for a, b in moments), "the encoder's optimiser resumes where it stopped"
    state["queue"].zero_()
    assert not bool((env.queue == 0).all()), "the saved state is a copy, not the live queue"


def test_the_env_defaults_are_the_spec_and_the_published_cpu_preset():
    """The reward and mask constants are the spec's (its default clauses; SAC-LEGAL-2's three; §2's hard boundary);
    the rest is the CPU preset that trained the published results (docs/results/sac/results.md: 256 passages of
    32 characters, a primed 4-character history): a default that moved would leave those figures describing
    another configuration."""
    import io
    import json
    import tarfile
    from pathlib import Path

    from rlconform.spec import default_spec

    spec = {k: v for c in default_spec().clauses.values() if c.kind == "default" and c.family == "sac"
            for k, v in c.value.items()}
    cfg = EnvConfig()
    for key in ("ngram_n", "window", "nce_tau", "lambda_cov", "lambda_nce", "lambda_gar", "lambda_ill", "lambda_bigram",
                "popart_eps"):
        assert getattr(cfg, key) == spec[key], key
    assert cfg.min_legal == 3 and cfg.illegal_done is True and cfg.teacher_mode == "reject"
    assert (cfg.n_envs, cfg.horizon, cfg.history, cfg.prime) == (256, 32, 4, True)
    assert (cfg.popart_beta, cfg.nce_dim, cfg.nce_queue, cfg.nce_momentum, cfg.nce_lr, cfg.whitelist_size) == \
        (1e-2, 32, 256, 0.99, 1e-3, 100)
    runs = Path(__file__).resolve().parents[2] / "docs" / "results" / "sac" / "runs.tar.gz"
    if runs.exists():  # a checkout: the published log agrees (one env step per passage and update)
        with tarfile.open(runs) as tar:
            lines = io.TextIOWrapper(tar.extractfile("seed0/metrics.jsonl")).read().splitlines()
        steps = [json.loads(ln)["env_steps"] for ln in lines[1:3]]
        assert steps == [cfg.n_envs, 2 * cfg.n_envs]


def test_the_fallback_whitelist_is_the_most_frequent_allowed_characters(corpus):
    """SAC-LEGAL-2's whitelist: the whitelist_size most frequent training characters, less the blacklisted ones."""
    env = _env(corpus, whitelist_size=40)
    counts = corpus.counts.tolist()
    top = sorted(range(len(counts)), key=lambda i: -counts[i])[:40]
    want = torch.zeros(corpus.vocab_size, dtype=torch.bool)
    want[[i for i in top if not bool(corpus.blacklist[i])]] = True
    assert torch.equal(env.whitelist, want) and 0 < int(want.sum()) <= 40
    few = torch.zeros(corpus.vocab_size, dtype=torch.bool)
    few[top[0]] = True  # one allowed character: the compliance set is too small, the whitelist takes over
    from reference_impl.sac.env import compliance_mask

    legal = compliance_mask(torch.full((2, 6), top[0]), allowed=few, punct=corpus.punct, whitelist=env.whitelist,
                            min_legal=3)
    want_legal = want.clone()
    want_legal[EOS] = True
    assert torch.equal(legal, want_legal.expand(2, -1))
    few[top[1]] = True  # two allowed characters and <eos>: three legal actions, no fallback (by default too)
    legal = compliance_mask(torch.full((1, 6), top[0]), allowed=few, punct=corpus.punct, whitelist=env.whitelist)
    assert legal[0].nonzero().flatten().tolist() == sorted([EOS, top[0], top[1]])


def test_the_ngram_encoder_maps_each_ngram_to_a_unit_vector():
    from reference_impl.sac.env import NgramEncoder

    f = NgramEncoder(50, 3, 8)
    out = f(torch.randint(0, 50, (5, 3), generator=torch.Generator().manual_seed(0)))
    assert out.shape == (5, 8) and torch.allclose(out.norm(dim=-1), torch.ones(5))


def test_the_env_lives_on_its_source_device(corpus):
    """Built and stepped on the simulated GPU (which refuses a host tensor beside a device one, as CUDA does)."""
    from conformance_tests import simdevice

    cfg = dataclasses.replace(EnvConfig(n_envs=4, horizon=10, history=6))
    with simdevice.simulate(), simdevice.implementation_call():
        env = CharEnv(corpus, corpus.train.to("cuda"), cfg, generator=torch.Generator(device="cuda").manual_seed(0))
        obs, reward, done, info = env.step(torch.full((4,), EOS, device="cuda"))
        tensors = [env.hist, env.ref, env.whitelist, env.queue, env.written, obs, reward, done, *env.f.parameters()]
        assert {t.device.type for t in tensors} == {"cuda"}


def test_the_bigram_lexicon_is_every_two_character_word_in_the_vocabulary(corpus):
    """SAC-BIGRAM-1's L as id pairs (key p * V + c): exactly the lexicon's two-character words whose both
    characters have ids, in order, and nothing else."""
    env = _env(corpus)
    V = corpus.vocab_size
    want = sorted({corpus.index[w[0]] * V + corpus.index[w[1]] for w in corpus.lexicon
                   if len(w) == 2 and w[0] in corpus.index and w[1] in corpus.index})
    assert want and env.pairs.tolist() == want
    assert all(len(corpus.chars[k // V] + corpus.chars[k % V]) == 2 for k in want)


def test_the_negative_queue_holds_forward_ngrams_of_the_source(corpus):
    """SAC-NCE-2's negatives: the frozen target encoder on K n-grams of the source, read forwards from random
    starts (the generator's first draw), before any step moves the encoders."""
    cfg = dataclasses.replace(EnvConfig(n_envs=4, horizon=10, history=6), nce_queue=16)
    env = CharEnv(corpus, corpus.train, cfg, generator=torch.Generator().manual_seed(9))
    assert not any(p.requires_grad for p in env.f_bar.parameters()), "the target encoder takes no gradient"
    n, src = cfg.ngram_n, corpus.train
    starts = torch.randint(0, len(src) - n, (16,), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = env.f_bar(torch.stack([src[s:s + n] for s in starts.tolist()]))
    assert torch.allclose(env.queue, want)


def test_a_source_just_long_enough_works(corpus):
    """Passage and n-gram starts stay inside the source: one of T + m + 1 characters leaves a single start."""
    cfg = dataclasses.replace(EnvConfig(n_envs=4, horizon=10, history=6), nce_queue=64)
    src = corpus.train[:17]
    for seed in range(3):
        env = CharEnv(corpus, src, cfg, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(env.ref, src[6:16].expand(4, -1)) and torch.equal(env.observe(), src[:6].expand(4, -1))
        env.reset()


def test_the_prime_window_is_the_prompt_without_pad_right_aligned(corpus):
    """The coverage texts start as the prime: its characters other than <pad>, in order, in the last slots of the
    W-slot window (NO_CHAR before); a prime longer than W keeps its last W characters."""
    from reference_impl.sac.reward import NO_CHAR

    env = _env(corpus, window=8)
    ids = [corpus.index[c] for c in "的国一年在中"]
    prompt = torch.tensor([ids, [PAD, PAD, *ids[:4]], [PAD, ids[5], PAD, ids[4], PAD, ids[3]]])
    got = env._prime_window(prompt)
    want = [[NO_CHAR] * 2 + [int(env.char_id[i]) for i in ids],
            [NO_CHAR] * 4 + [int(env.char_id[i]) for i in ids[:4]],
            [NO_CHAR] * 5 + [int(env.char_id[i]) for i in (ids[5], ids[4], ids[3])]]
    assert got.tolist() == want
    short = _env(corpus, window=4)
    assert short._prime_window(prompt[:1]).tolist() == [[int(short.char_id[i]) for i in ids[2:]]]
    env.reset(starts=torch.tensor([100, 200, 300, 400]))
    assert torch.equal(env.agent_win, env.ref_win) and torch.equal(env.agent_win, env._prime_window(env.prompt))


def test_the_bigram_bonus_pairs_each_action_with_the_previous_reference_character(corpus):
    """SAC-BIGRAM-1 in the env: step t pays lambda_bigram when (s_{t-1}, a_t) is a lexicon word, where s_{t-1} is
    the reference character before position t (at t = 0, the last character before the passage)."""
    src, chars, L = corpus.train, corpus.chars, corpus.lexicon

    def word(i: int, j: int) -> bool:
        return chars[int(i)] + chars[int(j)] in L

    starts = [s for s in range(8, len(src) - 12) if all(word(src[s + k - 1], src[s + k]) for k in range(3))
              and not word(src[s], src[s]) and not word(src[s - 1], src[s + 1]) and not word(src[s + 1], src[s + 1])
              and not word(src[s], src[s + 2]) and not word(src[s - 2], src[s])][:4]
    assert len(starts) == 4, "the corpus has runs of three overlapping two-character words (e.g. 中国人民)"
    env = _env(corpus)
    env.reset(starts=torch.tensor(starts))
    lam = env.cfg.lambda_bigram
    for t in range(3):
        a = env.teacher_action()
        _, _, _, info = env.step(a)
        assert not bool(info["illegal"].any())
        want = [lam * word(src[s + t - 1], src[s + t]) for s in starts]
        assert info["bonus"].tolist() == want, f"step {t}"
    _, _, _, info = env.step(torch.full((4,), EOS))  # (s_2, <eos>) spells no word
    assert info["bonus"].tolist() == [0.0] * 4


def test_a_masked_teacher_is_reported_rejected_only_where_it_was_asked_for(corpus):
    """SAC-TEACHER-1 (reject mode): where the reference's next character is illegal (a repeated comma), a
    teacher request is refused and flagged; a row that asked for nothing is not flagged; a legal teacher passes."""
    env = _env(corpus)
    env.reset(starts=torch.tensor([100, 200, 300, 400]))
    comma = corpus.index["，"]
    env.hist[:3, -1] = comma
    env.ref[:3, 0] = comma  # rows 0-2: the teacher would repeat the comma
    teacher = torch.tensor([True, False, True, True])
    env.hist[2, -1] = corpus.index["的"]  # row 2: no comma before, so its comma is legal
    _, _, _, info = env.step(torch.full((4,), EOS), teacher)
    assert info["teacher_rejected"].tolist() == [True, False, False, False]
    assert info["is_teacher"].tolist() == [False, False, True, True]
    assert info["action"][0] == EOS and info["action"][2] == comma


def test_without_a_reward_a_legal_step_ends_nothing_and_an_illegal_one_ends_its_row(corpus):
    cfg = dataclasses.replace(EnvConfig(n_envs=4, horizon=10, history=6))
    env = CharEnv(corpus, corpus.train, cfg, generator=torch.Generator().manual_seed(0), reward=False)
    a = torch.full((4,), EOS)
    a[1] = UNK
    _, reward, done, info = env.step(a)
    assert reward.tolist() == [0.0] * 4 and done.tolist() == [False, True, False, False]
    assert info["early"].tolist() == [False, True, False, False]


def test_an_illegal_last_step_is_not_an_early_termination(corpus):
    env = _env(corpus, horizon=2)
    env.step(torch.full((4,), EOS))
    a = torch.full((4,), EOS)
    a[0] = UNK
    _, _, done, info = env.step(a)
    assert bool(done.all()) and bool(info["illegal"][0]) and not bool(info["early"].any())


def test_infonce_scores_the_agents_ngram_against_the_reference_ngram_ending_here(corpus):
    """SAC-NCE-1/2 in the env: step t's query is the agent's last n characters, its positive the n reference
    characters ending at position t (the prime's where the passage has fewer), both through the encoders as they
    were before the step trains them."""
    import copy

    from reference_impl.sac.reward import info_nce

    env = _env(corpus, horizon=4)
    starts = torch.tensor([100, 200, 300, 400])
    env.reset(starts=starts)
    n, src = env.cfg.ngram_n, corpus.train
    for t in range(4):  # up to the horizon, where the positive is the passage's last n-gram
        f, f_bar, queue = copy.deepcopy(env.f), copy.deepcopy(env.f_bar), env.queue.clone()
        a = env.teacher_action() if t % 2 else torch.full((4,), EOS)
        _, _, _, info = env.step(a)
        ref_ng = torch.stack([src[s + t + 1 - n:s + t + 1] for s in starts.tolist()])
        with torch.no_grad():
            want = info_nce(f(env.hist[:, -n:]), f_bar(ref_ng), queue, tau=env.cfg.nce_tau)
        assert torch.allclose(info["nce"], want), f"step {t}"
    _, reward, _, info = env.step(torch.full((4,), EOS))  # a finished row stepped before its reset: no error
    assert bool(torch.isfinite(info["nce"]).all()) and bool(torch.isfinite(reward).all())


def test_coverage_is_scored_on_the_texts_and_the_bonus_adds_to_the_reward(corpus):
    """SAC-COV-1 on the agent's and the reference's texts (the prime, then the written characters), and the
    SAC-BIGRAM-1 bonus added to the reward: two envs that differ only in lambda_bigram differ by exactly it."""
    from reference_impl.sac.reward import ngram_coverage

    starts = torch.tensor([100, 200, 300, 400])
    envs = [_env(corpus, lambda_bigram=lam) for lam in (1.0, 0.0)]
    envs[1].load_state_dict(envs[0].state_dict())  # the same encoders, queue and PopArt streams
    for env in envs:
        env.reset(starts=starts)
    g, paid, written, src = torch.Generator().manual_seed(6), 0, [], corpus.train
    for t in range(5):
        a = envs[0].teacher_action() if t % 2 else _legal_sample(envs[0], g)
        written.append(a)
        (_, r1, _, i1), (_, r0, _, i0) = (env.step(a.clone()) for env in envs)
        want = []
        for r, s in enumerate(starts.tolist()):  # the texts written out: the prime, then t + 1 characters
            prime = _text(corpus, src[s - 6:s])
            agent, ref = prime + _text(corpus, torch.stack(written, 1)[r]), prime + _text(corpus, src[s:s + t + 1])
            want.append(ngram_coverage(agent, ref, n=3, window=64))
        assert torch.allclose(i1["cov"], torch.tensor(want, dtype=i1["cov"].dtype)), f"step {t}"
        assert torch.allclose(r1 - r0, i1["bonus"]) and torch.equal(i0["bonus"], torch.zeros(4))
        paid += int((i1["bonus"] != 0).sum())
    assert paid > 0, "some step spelled a lexicon word"


def test_the_online_encoder_learns_to_agree_with_the_target(corpus):
    """One contrastive step raises the InfoNCE score of the reference n-grams (it descends -nce, SAC-NCE-1) and
    moves the target encoder a (1 - m) share of the way (SAC-NCE-3)."""
    import copy

    from reference_impl.sac.reward import info_nce

    env = _env(corpus)
    ngrams = torch.stack([corpus.train[s:s + 3] for s in range(500, 532)])
    with torch.no_grad():
        pos = env.f_bar(ngrams)
    queue, bar = env.queue.clone(), copy.deepcopy(env.f_bar)

    def score():
        with torch.no_grad():
            return float(info_nce(env.f(ngrams), pos, queue, tau=env.cfg.nce_tau).mean())

    before = score()
    env._train_encoder(ngrams, pos)
    assert score() > before
    m = env.cfg.nce_momentum
    for new, old, online in zip(env.f_bar.parameters(), bar.parameters(), env.f.parameters()):
        assert torch.allclose(new, m * old + (1 - m) * online)
    assert torch.equal(env.queue[:32], pos) and torch.equal(env.queue[32:], queue[:-32])
