"""A small text policy built here from nothing: hashed word tokens, two GRU encoders, a scorer.

The policy scores each admissible command against the observation and normalises over the
admissible set, the way TextWorld agents (and LLM agents that rank candidate actions) do. Words
are hashed into a fixed vocabulary, so held-out games with unseen object names need no new vocabulary
and nothing is downloaded.
"""
from __future__ import annotations

import re
import zlib

import torch
from torch import nn

_WORD = re.compile(r"[a-z]+|\d+")
PAD = 0


class Tokenizer:
    """Lower-cased words hashed (crc32, stable across processes) into ids 1..vocab-1; 0 pads."""

    def __init__(self, vocab: int, max_len: int):
        self.vocab, self.max_len = vocab, max_len
        self._cache: dict[str, list[int]] = {}

    def ids(self, text: str) -> list[int]:
        got = self._cache.get(text)
        if got is None:
            words = _WORD.findall(text.lower())[: self.max_len]
            got = [1 + zlib.crc32(w.encode()) % (self.vocab - 1) for w in words] or [PAD]
            self._cache[text] = got
        return got

    def batch(self, texts: list[str], device) -> torch.Tensor:
        """[len(texts), longest] token ids, right-padded."""
        rows = [self.ids(t) for t in texts]
        out = torch.full((len(rows), max(len(r) for r in rows)), PAD, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        return out.to(device)


class TextPolicy(nn.Module):
    """log pi(c | o) = log_softmax_c( MLP([GRU_obs(o), GRU_cmd(c)]) ) over the admissible c."""

    def __init__(self, vocab: int = 4096, embed: int = 32, hidden: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed, padding_idx=PAD)
        self.obs_rnn = nn.GRU(embed, hidden, batch_first=True)
        self.cmd_rnn = nn.GRU(embed, hidden, batch_first=True)
        self.score = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def _encode(self, rnn: nn.GRU, tokens: torch.Tensor) -> torch.Tensor:
        """Final hidden state of each row, read at its own length (padding never enters it)."""
        lengths = (tokens != PAD).sum(1).clamp_min(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                                   enforce_sorted=False)
        return rnn(packed)[1][0]

    def forward(self, obs_tokens: torch.Tensor, cmd_tokens: torch.Tensor, obs_idx: torch.Tensor,
                cmd_idx: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [..., K] over candidate slots; illegal (padding) slots get -inf.

        obs_tokens [U_o, L] and cmd_tokens [U_c, L'] are the distinct texts of the batch, encoded
        once each; obs_idx [...] and cmd_idx [..., K] say which of them every step and slot uses.
        """
        h_obs = self._encode(self.obs_rnn, obs_tokens)[obs_idx]  # [..., H]
        h_cmd = self._encode(self.cmd_rnn, cmd_tokens)[cmd_idx]  # [..., K, H]
        pair = torch.cat([h_obs.unsqueeze(-2).expand_as(h_cmd), h_cmd], -1)
        logits = self.score(pair).squeeze(-1).masked_fill(~legal, float("-inf"))
        return torch.log_softmax(logits, -1)
