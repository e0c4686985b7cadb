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
5. done at T steps or on an illegal action with ``illegal_done`` (§2, SAC-REWARD-2).

``reset(rows)`` restarts finished rows on fresh passages; with ``prime`` the history starts as the
``m`` reference characters that precede the passage: a teacher override by a whole segment g_t,
which §2 allows, and only past text.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.sac.corpus import EOS, PAD, UNK, Corpus
from reference_impl.sac.data import resolve_teacher_action
from reference_impl.sac.masking import legal_set
from reference_impl.sac.reward import bigram_bonus, info_nce, ngram_coverage, step_reward
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
    """B passages of ``source`` (1-D ids) rewritten in parallel; see the module docstring."""

    def __init__(self, corpus: Corpus, source: torch.Tensor, cfg: EnvConfig, *, generator: torch.Generator,
                 reward: bool = True):
        self.c, self.src, self.cfg, self.g, self.with_reward = corpus, source, cfg, generator, reward
        B, T, m, V = cfg.n_envs, cfg.horizon, cfg.history, corpus.vocab_size
        self.B, self.T, self.m, self.V = B, T, m, V
        self.glyph = [("\x00", "\ufffd", "\n")[i] if i <= EOS else ch for i, ch in enumerate(corpus.chars)]
        self.allowed = ~corpus.blacklist  # static part of Compliance
        self.whitelist = torch.zeros(V, dtype=torch.bool)
        self.whitelist[corpus.counts.argsort(descending=True)[: cfg.whitelist_size]] = True
        self.whitelist &= self.allowed
        self.hist = torch.full((B, m), PAD, dtype=torch.long)  # h_{t-1}: the agent's own characters
        self.ref = torch.zeros(B, T, dtype=torch.long)  # reference passage (reward/teacher only)
        self.prompt = torch.full((B, m), PAD, dtype=torch.long)
        self.t = torch.zeros(B, dtype=torch.long)
        self.agent_text = [""] * B
        self.ref_text = [""] * B
        # reward state (SAC-POPART-1: one stream per reward term and env row; SAC-NCE-3: EMA target encoder)
        self.popart = {k: [torch.zeros(B), torch.ones(B)] for k in ("cov", "nce")}
        self.f = NgramEncoder(V, cfg.ngram_n, cfg.nce_dim)
        self.f_bar = NgramEncoder(V, cfg.ngram_n, cfg.nce_dim).requires_grad_(False)
        self.f_bar.load_state_dict(self.f.state_dict())
        self.f_opt = torch.optim.Adam(self.f.parameters(), lr=cfg.nce_lr)
        with torch.no_grad():
            starts = torch.randint(0, len(source) - cfg.ngram_n, (cfg.nce_queue,), generator=generator)
            self.queue = self.f_bar(source[starts[:, None] + torch.arange(cfg.ngram_n)])  # negatives [K, d]
        self.reset()

    # ------------------------------------------------------------------ observation, legality
    def observe(self) -> torch.Tensor:
        """o_t: the agent's last m characters, [B, m] long. Nothing of the reference."""
        return self.hist.clone()

    def legal_mask(self, obs: torch.Tensor | None = None) -> torch.Tensor:
        """A(s) for each row of ``obs`` (default: the current histories), [N, V] bool."""
        return compliance_mask(self.hist if obs is None else obs, allowed=self.allowed, punct=self.c.punct,
                               whitelist=self.whitelist, min_legal=self.cfg.min_legal)

    # ------------------------------------------------------------------ episode control
    def reset(self, rows: torch.Tensor | None = None, starts: torch.Tensor | None = None) -> torch.Tensor:
        """Restart ``rows`` (bool [B], default all) on passages starting at ``starts`` (random by default)."""
        rows = torch.ones(self.B, dtype=torch.bool) if rows is None else rows.bool()
        idx = rows.nonzero().flatten()
        if len(idx):
            if starts is None:
                starts = torch.randint(self.m, len(self.src) - self.T, (len(idx),), generator=self.g)
            self.ref[idx] = self.src[starts[:, None] + torch.arange(self.T)]
            self.prompt[idx] = self.src[starts[:, None] - self.m + torch.arange(self.m)]
            self.hist[idx] = self.prompt[idx] if self.cfg.prime else PAD
            self.t[idx] = 0
            for b in idx.tolist():
                self.ref_text[b] = self._text(self.prompt[b]) if self.cfg.prime else ""
                self.agent_text[b] = self.ref_text[b]
        return self.observe()

    def _text(self, ids: torch.Tensor) -> str:
        return "".join(self.glyph[i] for i in ids.tolist() if i != PAD)

    def teacher_action(self) -> torch.Tensor:
        """The reference's next character per row (teacher only; never part of the observation)."""
        return self.ref.gather(1, self.t.clamp_max(self.T - 1)[:, None]).squeeze(1)

    def step(self, action: torch.Tensor, teacher: torch.Tensor | None = None):
        """Write one character per row. ``teacher`` (bool [B]) asks for a teacher override.

        Returns ``(obs, reward, done, info)``; finished rows keep their terminal observation until
        :meth:`reset` is called on them.
        """
        B, cfg = self.B, self.cfg
        legal = self.legal_mask()
        teacher = torch.zeros(B, dtype=torch.bool) if teacher is None else teacher.bool()
        t_act, accepted, relabeled = resolve_teacher_action(self.teacher_action(), legal,
                                                            mode=cfg.teacher_mode)  # SAC-TEACHER-1
        is_teacher = teacher & accepted
        a = torch.where(is_teacher, t_act, action.long())
        illegal = ~legal.gather(1, a[:, None]).squeeze(1)  # ill_t = 1[a_t ∉ A(s_t)] (SAC-REWARD-1)
        garble = self.c.garble[a]
        prev_ref = torch.where(self.t > 0, self.ref.gather(1, (self.t - 1).clamp_min(0)[:, None]).squeeze(1),
                               self.prompt[:, -1])  # s_{t-1}^{(1)}: the previous target character
        cur_ref = self.teacher_action()
        self.hist = torch.cat([self.hist[:, 1:], a[:, None]], dim=1)  # h_t = shift_append(h_{t-1}, a_t)
        chars = [self.glyph[i] for i in a.tolist()]  # one conversion per step, not one per row
        for b, i in enumerate(cur_ref.tolist()):
            self.agent_text[b] += chars[b]
            self.ref_text[b] += self.glyph[i]
        self.t += 1
        info = {"action": a, "is_teacher": is_teacher, "is_relabeled": is_teacher & relabeled,
                "teacher_rejected": teacher & ~accepted, "illegal": illegal, "garble": garble}
        if self.with_reward:
            reward, hard_done, parts = self._reward(a, chars, prev_ref, illegal, garble)
            info.update(parts)
        else:
            reward, hard_done = torch.zeros(B), illegal & cfg.illegal_done
        done = hard_done | (self.t >= self.T)
        info["early"] = hard_done & (self.t < self.T)
        return self.observe(), reward, done, info

    # ------------------------------------------------------------------ reward (§5)
    def _reward(self, a, chars, prev_ref, illegal, garble):
        cfg, n = self.cfg, self.cfg.ngram_n
        cov = torch.tensor([ngram_coverage(self.agent_text[b], self.ref_text[b], n=n, window=cfg.window)
                            for b in range(self.B)])  # SAC-COV-1
        agent_ng = self.hist[:, -n:]
        ref_ng = torch.cat([self.prompt, self.ref], 1).gather(1, (self.t[:, None] + self.m - n
                                                                  + torch.arange(n)).clamp_max(self.m + self.T - 1))
        with torch.no_grad():
            pos = self.f_bar(ref_ng)
            nce = info_nce(self.f(agent_ng), pos, self.queue, tau=cfg.nce_tau)  # SAC-NCE-1, SAC-NCE-2
        self._train_encoder(ref_ng, pos)
        cov_n, nce_n = self._popart("cov", cov), self._popart("nce", nce)  # SAC-POPART-1, SAC-POPART-2
        r, hard_done = step_reward(cov_n, nce_n, garble, illegal, lam_cov=cfg.lambda_cov, lam_nce=cfg.lambda_nce,
                                   lam_gar=cfg.lambda_gar, lam_ill=cfg.lambda_ill,
                                   illegal_done=cfg.illegal_done)  # SAC-REWARD-1, SAC-REWARD-2
        bonus = torch.tensor([bigram_bonus(self.glyph[p], ch, self.c.lexicon, lam=cfg.lambda_bigram)
                              for p, ch in zip(prev_ref.tolist(), chars)])  # SAC-BIGRAM-1
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

    def popart_stats(self, reward: torch.Tensor | None = None) -> dict[str, float]:
        """Mean over the row streams of μ and σ per reward term (the PopArt panel of §11), and the mean
        of ``reward`` if given, converted in one call."""
        names, vals = [], []
        for k, (mu, var) in self.popart.items():
            names += [f"popart_{k}_mu", f"popart_{k}_sigma"]
            vals += [mu.mean(), var.sqrt().mean()]
        if reward is not None:
            names.append("reward_mean")
            vals.append(reward.float().mean().to(vals[0].dtype))
        return dict(zip(names, torch.stack(vals).tolist()))

    def state_dict(self) -> dict:
        """The learned reward state (episodes themselves restart on resume)."""
        return {"popart": self.popart, "f": self.f.state_dict(), "f_bar": self.f_bar.state_dict(),
                "f_opt": self.f_opt.state_dict(), "queue": self.queue}

    def load_state_dict(self, s: dict) -> None:
        self.popart = s["popart"]
        self.f.load_state_dict(s["f"])
        self.f_bar.load_state_dict(s["f_bar"])
        self.f_opt.load_state_dict(s["f_opt"])
        self.queue = s["queue"]


def compliance_mask(hist: torch.Tensor, *, allowed: torch.Tensor, punct: torch.Tensor, whitelist: torch.Tensor,
                    min_legal: int = 3) -> torch.Tensor:
    """Compliance(h_{t-1}, a): ``a`` is not blacklisted and does not repeat the previous punctuation mark;
    then A(s) = that ∪ {<eos>} with the whitelist fallback (SAC-LEGAL-1, SAC-LEGAL-2)."""
    prev = hist[:, -1]
    ids = torch.arange(allowed.numel(), device=hist.device)
    repeat = punct[prev][:, None] & (ids == prev[:, None])  # no "，，" or "。。" (no host sync: works on any device)
    return legal_set(allowed & ~repeat, eos_index=EOS, fallback=whitelist, min_legal=min_legal)


__all__ = ["CharEnv", "EnvConfig", "NgramEncoder", "compliance_mask", "EOS", "PAD", "UNK"]
