"""The leak-free char-level POMDP (seed 000, §2, §3, §5, §12, §15), vectorised over B passages.

The agent rewrites a reference passage one character at a time. Its observation is only its own
last ``m`` written characters (ids, ``<pad>`` where the history is empty): never the reference, never
the future (§2, §12). The reference is used for the reward, the teacher and the logs only.

Per step (all B rows at once):

1. legal set A(s) from the compliance rule on the agent's history (SAC-LEGAL-1, SAC-LEGAL-2);
2. optional teacher override (DAgger): the teacher action is the reference's next character; if the
   mask forbids it, it is rejected (the agent's own action runs) or relabelled (SAC-TEACHER-1);
3. shift-append the executed character to the history (§2 transition);
4. reward: n-gram coverage and InfoNCE, each PopArt-normalised, garble and illegal penalties
   (SAC-COV-1, SAC-NCE-1..3, SAC-POPART-1/2, SAC-REWARD-1/2), plus the lexical bigram bonus of the
   previous reference character and the action (SAC-BIGRAM-1) in the soft component;
5. done at T steps or on an illegal action with ``illegal_done`` (§2, SAC-REWARD-2). §2 makes the horizon a
   termination, so step T does not bootstrap (SAC-TD-1), though the observation carries no step count: the
   same window may be terminal in one row and bootstrapped in another. That is the seed's task, kept as written.

``reset(rows)`` restarts finished rows on fresh passages; with ``prime`` the history starts as the
``m`` reference characters that precede the passage: a teacher override by a whole segment g_t,
which §2 allows, and only past text.

The environment lives on the device of its source text and a step is tensor code over all rows, with
nothing read back to the host: the texts the coverage term compares are kept as the last W character
ids of each (``agent_win``, ``ref_win``), the bigram lexicon as sorted id pairs, and :meth:`CharEnv.texts`
decodes the strings only when asked (evaluation).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.sac.corpus import EOS, PAD, UNK, Corpus
from reference_impl.sac.data import resolve_teacher_action
from reference_impl.sac.masking import legal_set
from reference_impl.sac.reward import NO_CHAR, bigram_bonus_ids, info_nce, ngram_coverage_windows, step_reward
from reference_impl.sac.updates import ema_update, popart_step


@dataclasses.dataclass
class EnvConfig:
    n_envs: int = 256  # B parallel passages
    horizon: int = 32  # T: characters written per episode
    history: int = 4  # m: the agent's own characters in the observation window
    prime: bool = True  # start each history with the m reference characters before the passage
    ngram_n: int = 3  # n of the coverage and InfoNCE n-grams (SAC-DEFAULT-9)
    window: int = 64  # W: sliding window of the coverage reward (SAC-DEFAULT-9)
    nce_tau: float = 0.07  # InfoNCE temperature (SAC-DEFAULT-9)
    nce_dim: int = 32  # width of the char-n-gram encoder f
    nce_queue: int = 256  # K: negative queue length
    nce_momentum: float = 0.99  # m of the EMA target encoder (SAC-NCE-3)
    nce_lr: float = 1e-3  # Adam step of the online encoder f
    popart_beta: float = 1e-2  # PopArt/EMA rate beta, in [1e-4, 1e-2] (scaled up from 1e-3 for short runs)
    popart_eps: float = 1e-8  # PopArt epsilon
    lambda_cov: float = 1.0  # weight of N(cov)
    lambda_nce: float = 0.5  # weight of N(nce)
    lambda_gar: float = 0.1  # garble penalty
    lambda_ill: float = 2.0  # illegal penalty
    lambda_bigram: float = 1.0  # lexical bigram bonus
    illegal_done: bool = True  # an illegal action ends the episode (hard boundary)
    teacher_mode: str = "reject"  # a masked teacher action is rejected or relabelled (SAC-TEACHER-1)
    min_legal: int = 3  # below this many legal actions the whitelist applies (SAC-LEGAL-2)
    whitelist_size: int = 100  # fallback whitelist: the most frequent training characters


class NgramEncoder(nn.Module):
    """f: an n-gram of character ids -> a unit vector (position-aware embedding, one linear layer)."""

    def __init__(self, vocab: int, n: int, dim: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(n * dim, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.proj(self.emb(ids).flatten(1)), dim=-1)


class CharEnv:
    """B passages of ``source`` (1-D ids) rewritten in parallel; see the module docstring.

    Every tensor lives on ``source.device`` (the generator must be on it too), and a step is tensor code
    over all rows: no Python loop over rows, no read back to the host.
    """

    def __init__(self, corpus: Corpus, source: torch.Tensor, cfg: EnvConfig, *, generator: torch.Generator,
                 reward: bool = True):
        self.c, self.src, self.cfg, self.g, self.with_reward = corpus, source, cfg, generator, reward
        B, T, m, V = cfg.n_envs, cfg.horizon, cfg.history, corpus.vocab_size
        self.B, self.T, self.m, self.V = B, T, m, V
        dev = self.device = source.device
        specials = ("\x00", "\N{REPLACEMENT CHARACTER}", "\n")  # <pad>, <unk> and <eos> as the texts spell them
        self.glyph = [specials[i] if i <= EOS else ch for i, ch in enumerate(corpus.chars)]
        first = {}
        self.char_id = torch.tensor([first.setdefault(ch, i) for i, ch in enumerate(self.glyph)],
                                    device=dev)  # one id per distinct glyph: the texts' characters, as ids
        self.allowed = ~corpus.blacklist.to(dev)  # static part of Compliance
        self.punct, self.garble = corpus.punct.to(dev), corpus.garble.to(dev)
        self.whitelist = torch.zeros(V, dtype=torch.bool, device=dev)
        self.whitelist[corpus.counts.argsort(descending=True)[: cfg.whitelist_size].to(dev)] = True
        self.whitelist &= self.allowed
        self.hist = torch.full((B, m), PAD, dtype=torch.long, device=dev)  # h_{t-1}: the agent's own characters
        self.ref = torch.zeros(B, T, dtype=torch.long, device=dev)  # reference passage (reward/teacher only)
        self.prompt = torch.full((B, m), PAD, dtype=torch.long, device=dev)
        self.t = torch.zeros(B, dtype=torch.long, device=dev)
        # the texts: the executed characters (column T takes any written past the horizon), and the last W
        # characters of the agent's and the reference text as char ids, for the coverage term
        self.written = torch.zeros(B, T + 1, dtype=torch.long, device=dev)
        self.agent_win = torch.full((B, cfg.window), NO_CHAR, dtype=torch.long, device=dev)
        self.ref_win = self.agent_win.clone()
        # reward state (SAC-POPART-1: one stream per reward term and env row; SAC-NCE-3: EMA target encoder)
        self.popart = {k: [torch.zeros(B, device=dev), torch.ones(B, device=dev)] for k in ("cov", "nce")}
        self.f = NgramEncoder(V, cfg.ngram_n, cfg.nce_dim).to(dev)
        self.f_bar = NgramEncoder(V, cfg.ngram_n, cfg.nce_dim).to(dev).requires_grad_(False)
        self.f_bar.load_state_dict(self.f.state_dict())
        self.f_opt = torch.optim.Adam(self.f.parameters(), lr=cfg.nce_lr)
        self.pairs = self._lexicon_pairs() if reward else None  # SAC-BIGRAM-1's L as id pairs
        with torch.no_grad():
            starts = torch.randint(0, len(source) - cfg.ngram_n, (cfg.nce_queue,), generator=generator, device=dev)
            self.queue = self.f_bar(source[starts[:, None] + torch.arange(cfg.ngram_n, device=dev)])  # negatives [K, d]
        self.reset()

    def _lexicon_pairs(self) -> torch.Tensor:
        """Sorted keys p·V + c of the id pairs whose glyphs spell a word of the lexicon (for bigram_bonus_ids)."""
        ids: dict[str, list[int]] = {}
        for i, ch in enumerate(self.glyph):
            ids.setdefault(ch, []).append(i)
        keys = {p * self.V + c for w in self.c.lexicon if len(w) == 2
                for p in ids.get(w[0], ()) for c in ids.get(w[1], ())}
        return torch.tensor(sorted(keys), dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ observation, legality
    def observe(self) -> torch.Tensor:
        """o_t: the agent's last m characters, [B, m] long. Nothing of the reference."""
        return self.hist.clone()

    def legal_mask(self, obs: torch.Tensor | None = None) -> torch.Tensor:
        """A(s) for each row of ``obs`` (default: the current histories), [N, V] bool."""
        return compliance_mask(self.hist if obs is None else obs, allowed=self.allowed, punct=self.punct,
                               whitelist=self.whitelist, min_legal=self.cfg.min_legal)

    # ------------------------------------------------------------------ episode control
    def reset(self, rows: torch.Tensor | None = None, starts: torch.Tensor | None = None) -> torch.Tensor:
        """Restart ``rows`` (bool [B], default all) on passages starting at ``starts`` ([B]; random by default;
        the entries of the other rows are not read). Draws a start for every row, so that which rows restart
        is never read back to the host."""
        rows = torch.ones(self.B, dtype=torch.bool, device=self.device) if rows is None else rows.bool()
        if starts is None:
            starts = torch.randint(self.m, len(self.src) - self.T, (self.B,), generator=self.g, device=self.device)
        ref = self.src[starts[:, None] + torch.arange(self.T, device=self.device)]
        prompt = self.src[starts[:, None] - self.m + torch.arange(self.m, device=self.device)]
        prime = self._prime_window(prompt) if self.cfg.prime else torch.full_like(self.agent_win, NO_CHAR)
        r = rows[:, None]
        self.ref, self.prompt = torch.where(r, ref, self.ref), torch.where(r, prompt, self.prompt)
        self.hist = torch.where(r, prompt if self.cfg.prime else torch.full_like(prompt, PAD), self.hist)
        self.agent_win = torch.where(r, prime, self.agent_win)  # both texts start as the prime
        self.ref_win = torch.where(r, prime, self.ref_win)
        self.t = torch.where(rows, 0, self.t)
        return self.observe()

    def _prime_window(self, prompt: torch.Tensor) -> torch.Tensor:
        """The prime as the texts hold it, in the coverage window: its characters other than <pad>, in order,
        right-aligned in W slots (NO_CHAR before)."""
        m, W = self.m, self.cfg.window
        kept = prompt != PAD
        # <pad> first, the rest in their order; the keys are distinct, so no device's sort has ties to break
        order = (kept.long() * m + torch.arange(m, device=self.device)).argsort(dim=1)
        chars = torch.where(kept.gather(1, order), self.char_id[prompt.gather(1, order)], NO_CHAR)
        if m >= W:
            return chars[:, m - W:]
        return torch.cat([torch.full((len(prompt), W - m), NO_CHAR, dtype=torch.long, device=self.device), chars], 1)

    def texts(self) -> tuple[list[str], list[str]]:
        """(agent text, reference text) of every row: the prime (without <pad>) and the t characters written
        since (at most T). A read back to the host: for evaluation and logs, not the step loop."""
        prompt, written, ref, t = (x.tolist() for x in (self.prompt, self.written, self.ref, self.t))
        g = self.glyph
        agent_texts, ref_texts = [], []
        for p, w, r, n in zip(prompt, written, ref, t):
            prime = "".join(g[i] for i in p if i != PAD) if self.cfg.prime else ""
            agent_texts.append(prime + "".join(g[i] for i in w[: min(n, self.T)]))
            ref_texts.append(prime + "".join(g[i] for i in r[: min(n, self.T)]))
        return agent_texts, ref_texts

    def teacher_action(self) -> torch.Tensor:
        """The reference's next character per row (teacher only; never part of the observation)."""
        return self.ref.gather(1, self.t.clamp_max(self.T - 1)[:, None]).squeeze(1)

    def step(self, action: torch.Tensor, teacher: torch.Tensor | None = None, legal: torch.Tensor | None = None):
        """Write one character per row. ``teacher`` (bool [B]) asks for a teacher override; ``legal`` is A(s_t)
        when the caller has already built it (for acting), :meth:`legal_mask` otherwise.

        Returns ``(obs, reward, done, info)``; finished rows keep their terminal observation until
        :meth:`reset` is called on them.
        """
        B, cfg, dev = self.B, self.cfg, self.device
        legal = self.legal_mask() if legal is None else legal
        teacher = torch.zeros(B, dtype=torch.bool, device=dev) if teacher is None else teacher.bool()
        t_act, accepted, relabeled = resolve_teacher_action(self.teacher_action(), legal,
                                                            mode=cfg.teacher_mode)  # SAC-TEACHER-1
        is_teacher = teacher & accepted
        a = torch.where(is_teacher, t_act, action.long())
        illegal = ~legal.gather(1, a[:, None]).squeeze(1)  # ill_t = 1[a_t ∉ A(s_t)] (SAC-REWARD-1)
        garble = self.garble[a]
        prev_ref = torch.where(self.t > 0, self.ref.gather(1, (self.t - 1).clamp_min(0)[:, None]).squeeze(1),
                               self.prompt[:, -1])  # s_{t-1}^{(1)}: the previous target character
        cur_ref = self.teacher_action()
        self.hist = _shift_append(self.hist, a)  # h_t = shift_append(h_{t-1}, a_t)
        self.written.scatter_(1, self.t.clamp_max(self.T)[:, None], a[:, None])
        self.agent_win = _shift_append(self.agent_win, self.char_id[a])  # the texts grow by a_t and the
        self.ref_win = _shift_append(self.ref_win, self.char_id[cur_ref])  # reference's character
        self.t += 1
        info = {"action": a, "is_teacher": is_teacher, "is_relabeled": is_teacher & relabeled,
                "teacher_rejected": teacher & ~accepted, "illegal": illegal, "garble": garble}
        if self.with_reward:
            reward, hard_done, parts = self._reward(a, prev_ref, illegal, garble)
            info.update(parts)
        else:
            reward, hard_done = torch.zeros(B, device=dev), illegal & cfg.illegal_done
        done = hard_done | (self.t >= self.T)
        info["early"] = hard_done & (self.t < self.T)
        return self.observe(), reward, done, info

    # ------------------------------------------------------------------ reward (§5)
    def _reward(self, a, prev_ref, illegal, garble):
        cfg, n = self.cfg, self.cfg.ngram_n
        cov = ngram_coverage_windows(self.agent_win, self.ref_win, n=n)  # SAC-COV-1 over the last W characters
        agent_ng = self.hist[:, -n:]
        ref_ng = torch.cat([self.prompt, self.ref], 1).gather(
            1, (self.t[:, None] + self.m - n + torch.arange(n, device=self.device)).clamp_max(self.m + self.T - 1))
        with torch.no_grad():
            pos = self.f_bar(ref_ng)
            nce = info_nce(self.f(agent_ng), pos, self.queue, tau=cfg.nce_tau)  # SAC-NCE-1, SAC-NCE-2
        self._train_encoder(ref_ng, pos)
        cov_n, nce_n = self._popart("cov", cov), self._popart("nce", nce)  # SAC-POPART-1, SAC-POPART-2
        r, hard_done = step_reward(cov_n, nce_n, garble, illegal, lam_cov=cfg.lambda_cov, lam_nce=cfg.lambda_nce,
                                   lam_gar=cfg.lambda_gar, lam_ill=cfg.lambda_ill,
                                   illegal_done=cfg.illegal_done)  # SAC-REWARD-1, SAC-REWARD-2
        bonus = bigram_bonus_ids(prev_ref, a, self.pairs, self.V, lam=cfg.lambda_bigram)  # SAC-BIGRAM-1
        bonus = torch.where(hard_done, torch.zeros_like(bonus), bonus)  # SAC-REWARD-2: a hard stop pays exactly -λ_ill
        return r + bonus, hard_done, {"cov": cov, "nce": nce, "bonus": bonus}  # bonus into the soft part (SAC-BIGRAM-1)

    def _popart(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """One PopArt/EMA step per env row: each row is its own scalar stream (the slots are exchangeable
        random passages), which keeps the update one vectorised call per term and step."""
        mu, var = self.popart[key]
        out, mu, var = popart_step(mu, var, x, beta=self.cfg.popart_beta, eps=self.cfg.popart_eps)
        self.popart[key] = [mu, var]
        return out

    def _train_encoder(self, ref_ng: torch.Tensor, pos: torch.Tensor) -> None:
        """One contrastive step of f on the reference n-grams, then the EMA target and the queue."""
        loss = -info_nce(self.f(ref_ng), pos, self.queue, tau=self.cfg.nce_tau).mean()  # SAC-NCE-1
        self.f_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.f_opt.step()
        with torch.no_grad():
            for pb, p in zip(self.f_bar.parameters(), self.f.parameters()):
                pb.copy_(ema_update(pb, p, m=self.cfg.nce_momentum))  # SAC-NCE-3
        self.queue = torch.cat([pos, self.queue])[: self.cfg.nce_queue]  # FIFO of past positives

    def popart_summary(self, reward: torch.Tensor | None = None) -> tuple[list[str], torch.Tensor]:
        """The PopArt panel of §11 as names and one vector on the device: the mean over the row streams of
        μ and σ per reward term, and the mean of ``reward`` if given (the caller reads it when it likes)."""
        names, vals = [], []
        for k, (mu, var) in self.popart.items():
            names += [f"popart_{k}_mu", f"popart_{k}_sigma"]
            vals += [mu.mean(), var.sqrt().mean()]
        if reward is not None:
            names.append("reward_mean")
            vals.append(reward.float().mean().to(vals[0].dtype))
        return names, torch.stack(vals)

    def popart_stats(self, reward: torch.Tensor | None = None) -> dict[str, float]:
        """:meth:`popart_summary` as floats, converted in one call."""
        names, vals = self.popart_summary(reward)
        return dict(zip(names, vals.tolist()))

    def state_dict(self) -> dict:
        """The learned reward state, on the host (episodes themselves restart on resume)."""
        return _to_host({"popart": self.popart, "f": self.f.state_dict(), "f_bar": self.f_bar.state_dict(),
                         "f_opt": self.f_opt.state_dict(), "queue": self.queue})

    def load_state_dict(self, s: dict) -> None:
        self.popart = {k: [x.to(self.device) for x in v] for k, v in s["popart"].items()}
        self.f.load_state_dict(s["f"])
        self.f_bar.load_state_dict(s["f_bar"])
        self.f_opt.load_state_dict(s["f_opt"])  # moves the moments to the parameters' device
        self.queue = s["queue"].to(self.device)


def _shift_append(x: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Drop the oldest column of ``x`` [B, k] and append ``new`` [B]."""
    return torch.cat([x[:, 1:], new[:, None]], dim=1)


def _to_host(obj):
    """A nested state with every tensor copied to the host (checkpoints load on any device)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_host(v) for v in obj)
    return obj


def compliance_mask(hist: torch.Tensor, *, allowed: torch.Tensor, punct: torch.Tensor, whitelist: torch.Tensor,
                    min_legal: int = 3) -> torch.Tensor:
    """Compliance(h_{t-1}, a): ``a`` is not blacklisted and does not repeat the previous punctuation mark;
    then A(s) = that ∪ {<eos>} with the whitelist fallback (SAC-LEGAL-1, SAC-LEGAL-2)."""
    prev = hist[:, -1]
    ids = torch.arange(allowed.numel(), device=hist.device)
    repeat = punct[prev][:, None] & (ids == prev[:, None])  # no "，，" or "。。" (no host sync: works on any device)
    return legal_set(allowed & ~repeat, eos_index=EOS, fallback=whitelist, min_legal=min_legal)


__all__ = ["CharEnv", "EnvConfig", "NgramEncoder", "compliance_mask", "EOS", "PAD", "UNK"]
