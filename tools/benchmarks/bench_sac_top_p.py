"""Top-p selection + Top-p soft value (SAC-TOPP-1..3) at batch 2048 over 6000 actions (a Chinese
character vocabulary): the vectorised reference against a per-row Python loop doing the same work.

The loop runs on the first ``LOOP_ROWS`` rows and its median is scaled by 2048 / LOOP_ROWS (rows are
independent, so the loop's cost is linear in the row count); both use ``benchmark.pedantic`` with a
few rounds, on one torch thread. The ratio of the medians is printed at the end of the run
(see conftest.py).
"""
from __future__ import annotations

import pytest
import torch

from reference_impl.sac import masked_softmax, top_p_soft_value

BATCH, ACTIONS, P, ALPHA = 2048, 6000, 0.98, 0.2
LOOP_ROWS = 256
PAIR = ("top_p_soft_value [2048 x 6000]", "top_p/loop", "top_p/vectorised")


@pytest.fixture(scope="module")
def inputs():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core for both variants: stable timings on a shared machine
    g = torch.Generator().manual_seed(0)
    # peaked rows, as a trained character policy: Zipf-like logits plus noise
    rank = torch.rand(BATCH, ACTIONS, generator=g).argsort(-1).float() + 1.0
    logits = -1.1 * torch.log(rank) * 3.0 + 0.5 * torch.randn(BATCH, ACTIONS, generator=g)
    legal = torch.rand(BATCH, ACTIONS, generator=g) > 0.02
    legal[:, 0] = True  # <eos>
    probs = masked_softmax(logits, legal)
    q1 = torch.randn(BATCH, ACTIONS, generator=g)
    q2 = torch.randn(BATCH, ACTIONS, generator=g)
    yield probs, q1, q2, legal
    torch.set_num_threads(threads)


def top_p_soft_value_loop(probs, q1, q2, legal, *, alpha: float, p: float) -> torch.Tensor:
    """Row by row: legal actions by decreasing probability (ties: lower id), keep while the mass
    before an action is below p, renormalise, then Σ π_p (min(q1, q2) − α log π_p)."""
    out = torch.empty(len(probs), dtype=probs.dtype)
    for i in range(len(probs)):
        ids = legal[i].nonzero().flatten()
        pi = probs[i, ids]
        order = torch.sort(pi, descending=True, stable=True).indices
        pi, ids = pi[order], ids[order]
        before = torch.cumsum(pi, 0) - pi
        keep = before < p
        pi_p = pi[keep] / pi[keep].sum()
        qmin = torch.minimum(q1[i, ids[keep]], q2[i, ids[keep]])
        out[i] = (pi_p * (qmin - alpha * torch.log(pi_p))).sum()
    return out


def test_loop_matches_vectorised(inputs):
    probs, q1, q2, legal = (x[:64] for x in inputs)
    torch.testing.assert_close(top_p_soft_value_loop(probs, q1, q2, legal, alpha=ALPHA, p=P),
                               top_p_soft_value(probs, q1, q2, legal, alpha=ALPHA, p=P), rtol=1e-5, atol=1e-5)


def test_top_p_vectorised(benchmark, inputs, record_median):
    probs, q1, q2, legal = inputs
    benchmark.group = "top_p_soft_value"
    benchmark.pedantic(top_p_soft_value, args=(probs, q1, q2, legal), kwargs={"alpha": ALPHA, "p": P},
                       rounds=5, iterations=1, warmup_rounds=1)
    record_median("top_p/vectorised", benchmark, pair=PAIR)


def test_top_p_loop(benchmark, inputs, record_median):
    probs, q1, q2, legal = (x[:LOOP_ROWS] for x in inputs)
    benchmark.group = "top_p_soft_value"
    benchmark.extra_info["rows"] = LOOP_ROWS
    benchmark.extra_info["scaled_to_rows"] = BATCH
    benchmark.pedantic(top_p_soft_value_loop, args=(probs, q1, q2, legal), kwargs={"alpha": ALPHA, "p": P},
                       rounds=3, iterations=1)
    record_median("top_p/loop", benchmark, scale=BATCH / LOOP_ROWS, pair=PAIR)


def test_top_p_full_sort(benchmark, inputs, record_median):
    """The reference with its candidate shortcut off: every row sorted over all 6000 actions."""
    probs, q1, q2, legal = inputs
    benchmark.group = "top_p_soft_value"
    benchmark.pedantic(top_p_soft_value, args=(probs, q1, q2, legal), kwargs={"alpha": ALPHA, "p": P, "candidates": 0},
                       rounds=5, iterations=1, warmup_rounds=1)
    record_median("top_p/full_sort", benchmark, pair=("top_p_soft_value, full sort / top-256 candidates",
                                                      "top_p/full_sort", "top_p/vectorised"))
