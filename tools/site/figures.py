"""The figures, drawn at build time with matplotlib by calling the reference implementation's own functions
(matplotlib and torch are imported only when the figures are drawn)."""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import io
from typing import Callable

from tools.site.markup import rel, text


@dataclasses.dataclass
class Figure:
    name: str
    family: str
    title: str
    caption: str
    png: bytes | None = None
    note: str = ""

    @property
    def path(self) -> str:
        return f"figures/{self.name}.png"

    def markdown(self, from_page: str) -> list[str]:
        if self.png is None:
            return [f"**{self.title}**: not drawn ({text(self.note)})."]
        # the caption keeps its \\( \\) spans for MathJax; `{: .caption }` styles the paragraph
        return [f"![{self.title}]({rel(from_page, self.path)})", "", f"{self.caption}", "{: .caption }"]


def _ref(family: str, *names: str):
    """Reference operations of a family, or None when the family (or one op) is not there yet."""
    if importlib.util.find_spec(f"reference_impl.{family}") is None:
        return None
    mod = importlib.import_module(f"reference_impl.{family}")
    ops = [getattr(mod, n, None) for n in names]
    return None if any(o is None for o in ops) else ops


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def figure_sac_top_p(plt, torch) -> bytes | None:
    ops = _ref("sac", "masked_softmax", "top_p_select")
    if ops is None:
        return None
    masked_softmax, top_p_select = ops
    p = 0.9
    logits = torch.tensor([[2.2, -0.4, 1.1, 3.0, 0.3, -1.2, 1.6, 0.8, 2.6, -0.2, 0.5, 1.9]], dtype=torch.float64)
    legal = torch.tensor([[True, True, False, True, True, True, True, False, False, True, True, True]])
    probs = masked_softmax(logits, legal)[0]
    sel = top_p_select(probs[None], legal, p=p)[0]
    order = sorted(range(len(probs)), key=lambda i: (not bool(legal[0, i]), -float(probs[i])))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    colors = ["#3949ab" if sel[i] else ("#9fa8da" if legal[0, i] else "#bdbdbd") for i in order]
    ax.bar(range(len(order)), [float(probs[i]) for i in order], color=colors)
    ax.set_xticks(range(len(order)), [f"a{i}" for i in order], fontsize=8)
    ax.set_ylabel("π(a|o) (probability)")
    ax.set_xlabel("action, most probable legal first")
    ax.set_title("masked softmax: Top-p set (dark), legal (light), illegal (grey, ε)")
    legal_sorted = [i for i in order if legal[0, i]]
    cum = torch.cumsum(torch.stack([probs[i] for i in legal_sorted]), 0)
    ax2.step(range(1, len(cum) + 1), cum.numpy(), where="mid", color="#3949ab", label="cumulative legal mass")
    ax2.axhline(p, color="#e53935", ls="--", label=f"p = {p}")
    ax2.axvline(int(sel.sum()), color="#757575", ls=":", label=f"|P| = {int(sel.sum())}")
    ax2.set_xlabel("legal actions, most probable first")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("cumulative probability")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    ax2.set_title("Top-p coverage")
    return _png(fig)


def figure_isr_weights(plt, torch) -> bytes | None:
    ops = _ref("isreshape", "reshape_weight", "sapo_weight")
    if ops is None:
        return None
    reshape_weight, sapo_weight = ops
    r = torch.linspace(0.01, 4.0, 400, dtype=torch.float64)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for g in (0.0, 0.25, 0.5, 0.75, 1.0):
        axes[0].plot(r, reshape_weight(r, g, tau=1.0), label=f"γ = {g:g}")
    axes[0].set_title("w_γ(r), τ = 1")
    for tau in (0.5, 1.0, 2.0, 4.0):
        axes[1].plot(r, reshape_weight(r, 0.75, tau=tau), label=f"τ = {tau:g}")
    axes[1].set_title("w_γ(r), γ = 0.75")
    axes[2].plot(r, sapo_weight(r, tau=1.0), label="SAPO r·sech²(τ(r−1)/2), τ = 1", color="#3949ab")
    ppo = ppo_clip_weight(torch, r)
    if ppo is not None:
        axes[2].plot(r, ppo[0], label="PPO-clip, A > 0 (ε = 0.2)", color="#e53935", ls="--")
        axes[2].plot(r, ppo[1], label="PPO-clip, A < 0 (ε = 0.2)", color="#fb8c00", ls=":")
    axes[2].set_title("reference points")
    for ax in axes:
        ax.set_xlabel("importance ratio r = π/μ")
        ax.axvline(1.0, color="#bdbdbd", lw=0.8)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    axes[0].set_ylabel("gradient weight w (per unit advantage)")
    return _png(fig)


def ppo_clip_weight(torch, r):
    """PPO-clip's effective weight: −∂loss/∂log π divided by A (per sample), by autograd on the
    reference ``ppo.clipped_policy_loss``; None when the ppo family is not there."""
    ops = _ref("ppo", "clipped_policy_loss")
    if ops is None:
        return None
    (loss_fn,) = ops
    out = []
    for sign in (1.0, -1.0):
        logp = torch.log(r).clone().requires_grad_(True)
        adv = torch.full_like(r, sign)
        loss = loss_fn(torch.exp(logp), adv, clip_eps=0.2)
        (g,) = torch.autograd.grad(loss.sum() * len(r) if loss.dim() == 0 else loss.sum(), logp)
        out.append((-g / adv).detach())
    return out


def figure_isr_f(plt, torch) -> bytes | None:
    ops = _ref("isreshape", "reshape_f")
    if ops is None:
        return None
    (reshape_f,) = ops
    r = torch.linspace(0.05, 4.0, 400, dtype=torch.float64)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for g in (0.0, 0.25, 0.5, 0.75, 1.0):
        axes[0].plot(r, reshape_f(r, g, tau=1.0), label=f"γ = {g:g}")
    axes[0].set_title("f_γ(r), τ = 1")
    for tau in (0.5, 1.0, 2.0, 4.0):
        axes[1].plot(r, reshape_f(r, 1.0, tau=tau), label=f"τ = {tau:g}")
    axes[1].set_title("f_1(r) = (2/τ)·tanh(τ(r−1)/2)")
    for ax in axes:
        ax.set_xlabel("importance ratio r = π/μ")
        ax.set_ylabel("objective f(r)")
        ax.axhline(0, color="#bdbdbd", lw=0.8)
        ax.axvline(1.0, color="#bdbdbd", lw=0.8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


def figure_ccapo_q(plt, torch) -> bytes | None:
    ops = _ref("ccapo", "importance", "criticality", "distance_decay", "q_stdb")
    if ops is None:
        return None
    importance, criticality, distance_decay, q_stdb = ops
    g_succ, g_total = 500.0, 1000.0  # a global success rate of 0.5

    def q(n_succ, n_total, d_goal):
        return q_stdb(importance(n_succ, n_total), criticality(n_succ, n_total, g_succ, g_total),
                      distance_decay(d_goal), lam=1.0)

    n_max = 40
    T, S = torch.meshgrid(torch.arange(1, n_max + 1, dtype=torch.float64),
                          torch.arange(0, n_max + 1, dtype=torch.float64), indexing="xy")
    grid = q(torch.minimum(S, T), T, torch.zeros_like(S))
    grid = torch.where(S <= T, grid, torch.full_like(grid, float("nan")))  # only N_succ <= N_total exists
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    im = ax.imshow(grid.numpy(), origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1,
                   extent=(0.5, n_max + 0.5, -0.5, n_max + 0.5))
    fig.colorbar(im, ax=ax, label=r"$Q_{\mathrm{STDB}}(E)$ (score in [0, 1])")
    ax.set_xlabel(r"$N_{\mathrm{total}}(E)$ (visits of the edge)")
    ax.set_ylabel(r"$N_{\mathrm{succ}}(E)$ (visits in successful episodes)")
    ax.set_title(r"$Q_{\mathrm{STDB}}$ over an edge's counts ($d_{\mathrm{goal}} = 0$)")
    n = torch.arange(1, n_max + 1, dtype=torch.float64)
    for share, ls in ((1.0, "-"), (0.5, "--"), (0.0, ":")):
        for d, color in ((0.0, "#3949ab"), (4.0, "#e53935")):
            ax2.plot(n, q(n * share, n, torch.full_like(n, d)), ls=ls, color=color,
                     label=f"N_succ/N_total = {share:g}, d_goal = {d:g}")
    ax2.set_xlabel(r"$N_{\mathrm{total}}(E)$ (visits of the edge)")
    ax2.set_ylabel(r"$Q_{\mathrm{STDB}}(E)$")
    ax2.set_ylim(0, 1)
    ax2.set_title("global success rate 0.5, λ = 1, α = 1")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


FIGURES: tuple[tuple[str, str, str, str, Callable], ...] = (
    ("sac-top-p", "sac", "Masked softmax and Top-p coverage",
     r"A 12-action row with three illegal actions: the policy after shifting, filling and \(\varepsilon\)-clipping, "
     r"and the smallest legal set whose mass reaches \(p = 0.9\) (reference `masked_softmax` and `top_p_select`).",
     figure_sac_top_p),
    ("isreshape-w", "isreshape", "IS-Reshape gradient weight w_γ(r)",
     r"\(w_\gamma(r) = (1-\gamma) + \gamma\, r\, \mathrm{sech}^2(\tau(r-1)/2)\) for several \(\gamma\) and "
     r"\(\tau\), beside SAPO's weight and PPO-clip's effective weight (which drops to zero outside the trust region "
     r"on the side the advantage pushes).",
     figure_isr_weights),
    ("isreshape-f", "isreshape", "IS-Reshape objective f_γ(r)",
     r"The closed form \(f_\gamma(r) = (1-\gamma)\log r + \gamma\,\tfrac{2}{\tau}\tanh(\tau(r-1)/2)\), whose "
     r"\(r\,f_\gamma'(r)\) is \(w_\gamma(r)\).", figure_isr_f),
    ("ccapo-q-stdb", "ccapo", "CCAPO edge score Q_STDB",
     r"\(Q_{\mathrm{STDB}} = \sigma(\log(I\,(1+\lambda C)\,D))\) over an edge's success and visit counts, "
     r"with the Bayesian-smoothed \(I(E)\).",
     figure_ccapo_q),
)


def make_figures() -> list[Figure]:
    """Draw every figure whose reference functions exist; the others carry a note saying why not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    plt.rcParams.update({"font.size": 9, "svg.hashsalt": "rlconform"})
    out = []
    for name, fam, title, caption, draw in FIGURES:
        try:
            png = draw(plt, torch)
        except Exception as e:  # a reference function changed under the figure: say which one
            raise RuntimeError(f"figure {name!r} ({fam}) failed: {type(e).__name__}: {e}") from e
        note = "" if png is not None else f"the reference `{fam}` functions it plots are not available in this build"
        out.append(Figure(name, fam, title, caption, png, note))
    return out


def figures_page(figures: list[Figure]) -> str:
    out = ["# Figures", "", "Drawn at build time with matplotlib by calling the reference implementation's own "
           "functions, so a figure always shows what the code computes.", ""]
    for fg in figures:
        out += [f"## {fg.title}", ""] + fg.markdown("figures.md") + [""]
    return "\n".join(out)
