"""Networks of the char-level SAC (seed 000, §4): window encoder, policy head, twin Q with action embeddings.

* Encoder (§4 allows GRU or Conv): character embedding E, then either a GRU over the agent's own
  window h_{t-1} whose last hidden state is c_t (``"gru"``: Enc(h) ⊕ u of §2), or one convolution
  whose kernel spans the whole window (``"conv"``: the position-aware window flattened into a linear
  layer; 5-10x cheaper on a CPU, the trainer's default).
* Policy head: z = MLP_θ(c_t) ∈ R^{|Σ|}; the trainer masks and normalises it (SAC-MASK-1/2).
* Q head: Q_φ(o, a) = MLP_φ([c_t; Emb_act(a)]). Evaluating that for all |Σ| actions at once would
  build a [B, |Σ|, hidden] tensor, so we use the efficient equivalent whose last layer is bilinear:
  Q_φ(o, a) = ⟨MLP_φ(c_t), Emb_act(a)⟩ + b_a, i.e. one [B, h] × [h, |Σ|] product for Q(o, ·).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


class WindowEncoder(nn.Module):
    """ids [B, m] -> c_t [B, hidden]."""

    def __init__(self, vocab: int, d_model: int, hidden: int, *, kind: str = "conv", window: int = 12):
        super().__init__()
        if kind not in ("gru", "conv"):
            raise ValueError(f"encoder kind must be 'gru' or 'conv', got {kind!r}")
        self.kind = kind
        self.emb = nn.Embedding(vocab, d_model)
        if kind == "gru":
            self.gru = nn.GRU(d_model, hidden, batch_first=True)
        else:
            self.conv = nn.Sequential(nn.Linear(window * d_model, hidden), nn.ReLU())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.emb(ids)
        if self.kind == "gru":
            return self.gru(e)[1][-1]
        return self.conv(e.flatten(1))


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))


class PolicyNet(nn.Module):
    """o -> unmasked logits z [B, V]."""

    def __init__(self, vocab: int, d_model: int, hidden: int, **enc):
        super().__init__()
        self.enc = WindowEncoder(vocab, d_model, hidden, **enc)
        self.head = _mlp(hidden, hidden, vocab)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(obs))


class QNet(nn.Module):
    """o -> Q(o, ·) [B, V] through action embeddings."""

    def __init__(self, vocab: int, d_model: int, hidden: int, **enc):
        super().__init__()
        self.enc = WindowEncoder(vocab, d_model, hidden, **enc)
        self.head = _mlp(hidden, hidden, d_model)
        self.act_emb = nn.Embedding(vocab, d_model)  # Emb_act (replaces V1's one-hot)
        self.act_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(obs)) @ self.act_emb.weight.T + self.act_bias


class TwinQ(nn.Module):
    """Q_φ1, Q_φ2 (their minimum is taken by the backup and the policy loss, SAC-V-1)."""

    def __init__(self, vocab: int, d_model: int, hidden: int, **enc):
        super().__init__()
        self.q1 = QNet(vocab, d_model, hidden, **enc)
        self.q2 = QNet(vocab, d_model, hidden, **enc)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q1(obs), self.q2(obs)


class TwinMLP(nn.Module):
    """Two MLPs of one shape (``dims``: in, hidden..., out; ReLU between layers) evaluated together: each
    layer is one batched matmul over the stacked weights [2, out, in], so the twin critics cost the ops and
    kernel launches of one network, forward and backward (the ensemble layout TorchRL gets from vmap).
    Each copy is initialised as ``nn.Linear`` would be, independently. ``forward(x [B, in]) -> (q1, q2)``."""

    def __init__(self, *dims: int, copies: int = 2):
        super().__init__()
        self.copies = copies
        self.weight = nn.ParameterList(nn.Parameter(torch.empty(copies, o, i)) for i, o in zip(dims, dims[1:]))
        self.bias = nn.ParameterList(nn.Parameter(torch.empty(copies, 1, o)) for o in dims[1:])
        for w, b in zip(self.weight, self.bias):
            for k in range(copies):  # nn.Linear's initialisation, copy by copy
                nn.init.kaiming_uniform_(w[k], a=math.sqrt(5))
                bound = 1 / math.sqrt(w.shape[-1])
                nn.init.uniform_(b[k], -bound, bound)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x.expand(self.copies, *x.shape)
        last = len(self.weight) - 1
        for k, (w, b) in enumerate(zip(self.weight, self.bias)):
            h = torch.baddbmm(b, h, w.transpose(1, 2))
            if k < last:
                h = torch.relu(h)
        return tuple(h.unbind(0))
