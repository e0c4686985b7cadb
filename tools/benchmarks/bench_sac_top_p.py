"""Top-p selection + Top-p soft value (SAC-TOPP-1..3) at batch 2048 over 6000 actions (a Chinese
character vocabulary): the reference (radix threshold search) against a plain ``torch.sort`` +
``cumsum`` implementation of the same rule, on flat, peaked and mixed batches (one flat row among
2047 peaked ones). A second contender runs the plain implementation on the same row blocks as the
reference, to show how much of the gain is the algorithm and how much the smaller temporaries.

Both contenders run on one torch thread, interleaved round by round (the plain one in the setup of
each pytest-benchmark round), and both are timed in thread CPU time, so a busy machine slows both
alike. Before timing, each batch checks that both select the same sets. The ratios plain / reference
of the medians are printed at the end of the run (see conftest.py).

Run: ``python -m pytest tools/benchmarks -k top_p --benchmark-only``.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from reference_impl.sac import masked_softmax, top_p_select, top_p_soft_value
from reference_impl.sac.backup import _CHUNK_BYTES

BATCH, ACTIONS, P, ALPHA = 2048, 6000, 0.98, 0.2
ROUNDS = 5
KINDS = ("flat", "peaked", "mixed")


def _logits(kind: str, g: torch.Generator, rows: int = BATCH, cols: int = ACTIONS) -> torch.Tensor:
    """flat: near-uniform; peaked: Zipf-like ranks plus noise, as a trained character policy."""
    flat = 0.3 * torch.randn(rows, cols, generator=g)
    rank = torch.rand(rows, cols, generator=g).argsort(-1).float() + 1.0
    peaked = -3.3 * torch.log(rank) + 0.5 * torch.randn(rows, cols, generator=g)
    if kind == "mixed":
        peaked[rows // 2] = flat[rows // 2]
    return flat if kind == "flat" else peaked


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core for both contenders: stable timings on a shared machine
    yield
    torch.set_num_threads(threads)


def _inputs(kind: str):
    g = torch.Generator().manual_seed(0)
    legal = torch.rand(BATCH, ACTIONS, generator=g) > 0.02
    legal[:, 0] = True  # <eos>
    probs = masked_softmax(_logits(kind, g), legal)  # float32, ε-clipped
    q1 = torch.randn(BATCH, ACTIONS, generator=g)
    q2 = torch.randn(BATCH, ACTIONS, generator=g)
    return probs, q1, q2, legal


def plain_select_sorted(probs, legal, *, p):
    """The plain implementation: stable sort (ties by lower id), float64 cumsum, keep while the mass
    before an action is below p. Returns the sort order and the kept mask in sorted order."""
    pi = torch.where(legal, probs, torch.zeros_like(probs))
    ranked, order = torch.sort(pi, dim=-1, descending=True, stable=True)
    upto = torch.cumsum(ranked, dim=-1, dtype=torch.float64)
    keep = (upto - ranked.double() < p) & legal.gather(-1, order)
    return ranked, order, keep


def plain_top_p_soft_value(probs, q1, q2, legal, *, alpha, p):
    """Σ π_p (min(q1, q2) − α log π_p), computed in sorted order (no scatter back)."""
    ranked, order, keep = plain_select_sorted(probs, legal, p=p)
    kept = torch.where(keep, ranked, torch.zeros_like(ranked))
    pi_p = kept / kept.sum(-1, keepdim=True)
    q = torch.minimum(q1.gather(-1, order), q2.gather(-1, order))
    safe = torch.where(keep, pi_p, torch.ones_like(pi_p))
    return torch.where(keep, pi_p * (q - alpha * torch.log(safe)), torch.zeros_like(pi_p)).sum(-1)


def plain_top_p_soft_value_chunked(probs, q1, q2, legal, *, alpha, p):
    """The plain implementation run on blocks of rows, as the reference does: it separates the gain
    of the algorithm from the gain of small temporaries (which the allocator reuses, see
    reference_impl.sac.backup._by_row_chunks)."""
    step = max(1, _CHUNK_BYTES // (8 * probs.shape[-1]))
    return torch.cat([plain_top_p_soft_value(probs[i:i + step], q1[i:i + step], q2[i:i + step], legal[i:i + step],
                                             alpha=alpha, p=p) for i in range(0, probs.shape[0], step)])


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _as_benchmark(median: float):
    """A median measured here, in the shape record_median reads from pytest-benchmark."""
    return SimpleNamespace(stats=SimpleNamespace(stats=SimpleNamespace(median=median)))


@pytest.mark.benchmark(timer=time.thread_time, disable_gc=True)
@pytest.mark.parametrize("kind", KINDS)
def test_top_p_reference_vs_plain_sort(benchmark, record_median, one_thread, kind):
    probs, q1, q2, legal = _inputs(kind)
    _, order, keep = plain_select_sorted(probs, legal, p=P)
    plain_sel = torch.zeros_like(legal).scatter(-1, order, keep)
    assert torch.equal(top_p_select(probs, legal, p=P), plain_sel), "the contenders select different sets"
    torch.testing.assert_close(top_p_soft_value(probs, q1, q2, legal, alpha=ALPHA, p=P),
                               plain_top_p_soft_value(probs, q1, q2, legal, alpha=ALPHA, p=P), rtol=1e-4, atol=1e-4)

    contenders = {"plain_sort": plain_top_p_soft_value, "plain_sort_chunked": plain_top_p_soft_value_chunked}
    times: dict[str, list[float]] = {name: [] for name in contenders}

    def plain_round():  # runs, untimed by pytest-benchmark, right before each reference round
        for name, fn in contenders.items():
            t0 = time.thread_time()
            fn(probs, q1, q2, legal, alpha=ALPHA, p=P)
            times[name].append(time.thread_time() - t0)

    benchmark.group = "top_p_soft_value [2048 x 6000]"
    benchmark.extra_info["kind"] = kind
    benchmark.pedantic(top_p_soft_value, args=(probs, q1, q2, legal), kwargs={"alpha": ALPHA, "p": P},
                       setup=plain_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    for name, ts in times.items():
        benchmark.extra_info[f"{name}_median_s"] = _median(ts)
        record_median(f"top_p/{kind}/{name}", _as_benchmark(_median(ts)))
    record_median(f"top_p/{kind}/reference", benchmark,
                  pair=(f"Top-p select + soft value, {kind} [2048 x 6000], plain sort+cumsum / reference",
                        f"top_p/{kind}/plain_sort", f"top_p/{kind}/reference"))
    record_median(f"top_p/{kind}/reference", benchmark,
                  pair=(f"the same, plain also in row chunks ({kind}) / reference",
                        f"top_p/{kind}/plain_sort_chunked", f"top_p/{kind}/reference"))
