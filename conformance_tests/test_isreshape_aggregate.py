"""Loss aggregation modes (ISR-AGG-1): token-mean (the seed's), seq-mean-token-mean, seq-mean-token-sum,
token-sum. The oracle is an explicit per-row numpy loop over the masked-in tokens only."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_rejects,
    assert_that,
    fits,
    require_differentiable,
    require_dtype,
    working_dtype,
)
from conformance_tests.oracles import np_

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum")
GARBAGE = 1e6  # what masked-out entries hold: finite, large, and never part of the result


def np_aggregate(loss, mask, mode) -> tuple[float, np.ndarray]:
    """(value, ∂value/∂loss) from the masked-in tokens, row by row."""
    rows = [[t for t in range(loss.shape[1]) if mask[b, t]] for b in range(loss.shape[0])]
    live = [b for b, ts in enumerate(rows) if ts]
    n_tok = sum(len(ts) for ts in rows)
    weight = np.zeros(loss.shape)
    for b in live:
        for t in rows[b]:
            weight[b, t] = {"token-mean": 1.0 / n_tok, "token-sum": 1.0,
                            "seq-mean-token-mean": 1.0 / (len(live) * len(rows[b])),
                            "seq-mean-token-sum": 1.0 / len(live)}[mode]
    return float(sum(weight[b, t] * loss[b, t] for b in live for t in rows[b])), weight


@st.composite
def token_losses(draw, dtype):
    """[B,T] losses with garbage at masked-out entries, a bool or 0/1 float mask holding >= 1 token;
    rows may be empty (pure padding)."""
    b, t = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    loss = draw(st_.tensors((b, t), lo=-5.0, hi=5.0, dtype=dtype))
    mask = draw(st_.legal_masks((1, b * t))).reshape(b, t)  # >= 1 token in all
    if b > 1 and draw(st.booleans()):
        mask[draw(st.integers(0, b - 1))] = False  # a pure-padding row
        if not mask.any():
            mask[0, 0] = True
    loss = torch.where(mask, loss, torch.full_like(loss, fits(GARBAGE, dtype)))
    as_float = draw(st.booleans())
    return loss, (mask.to(dtype) if as_float else mask), draw(st.sampled_from(MODES))


@pytest.mark.clause("ISR-AGG-1")
@given(st.data())
def test_aggregate_matches_the_per_row_loop(isreshape, data):
    loss, mask, mode = data.draw(token_losses(working_dtype()))
    got = isreshape.aggregate_loss(loss, mask, mode=mode)
    value, _ = np_aggregate(np_(loss), np_(mask).astype(bool), mode)
    assert_close(got, value, "ISR-AGG-1", what=mode)


@pytest.mark.clause("ISR-AGG-1")
@given(st.data())
def test_aggregate_gradient_is_each_tokens_weight(isreshape, data):
    require_differentiable("isreshape.aggregate_loss")
    loss, mask, mode = data.draw(token_losses(working_dtype()))
    loss = loss.clone().requires_grad_(True)
    got = isreshape.aggregate_loss(loss, mask, mode=mode)
    (grad,) = torch.autograd.grad(got, [loss])
    _, weight = np_aggregate(np_(loss), np_(mask).astype(bool), mode)
    assert_close(grad, weight, "ISR-AGG-1", approx="gradient", what=f"d {mode} / d loss (0 on masked-out tokens)")


@pytest.mark.clause("ISR-AGG-1")
def test_aggregate_golden_modes_differ(isreshape):
    # rows of 2 and 1 tokens plus an empty row: each mode weighs the tokens differently
    dt = working_dtype()
    g = fits(GARBAGE, dt)
    loss = torch.tensor([[1.0, 2.0, g], [4.0, g, g], [g, g, g]], dtype=dt)
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    expected = {"token-mean": 7.0 / 3.0, "seq-mean-token-mean": (1.5 + 4.0) / 2.0,
                "seq-mean-token-sum": (3.0 + 4.0) / 2.0, "token-sum": 7.0}
    for mode, value in expected.items():
        assert_close(isreshape.aggregate_loss(loss, mask, mode=mode), value, "ISR-AGG-1", what=mode)


@pytest.mark.clause("ISR-AGG-1")
def test_aggregate_default_mode_is_token_mean(isreshape):
    dt = working_dtype()
    loss = torch.tensor([[1.0, 2.0], [4.0, 0.0]], dtype=dt)
    mask = torch.tensor([[True, True], [True, False]])
    assert_close(isreshape.aggregate_loss(loss, mask), 7.0 / 3.0, "ISR-AGG-1", what="the seed's token-mean")


@pytest.mark.clause("ISR-AGG-1")
def test_token_mean_guard_is_at_most_1e_8(isreshape):
    """Σ l·m / (Σ m + ε) with 0 ≤ ε ≤ 1e-8 (the contract's bound): one token of loss 1 gives a value in
    [1 / (1 + 1e-8), 1]; a larger guard, or one subtracted, leaves that interval (in float64; in a
    narrower working dtype the interval rounds to the point 1)."""
    dt = working_dtype()
    got = float(torch.as_tensor(isreshape.aggregate_loss(torch.ones(1, 2, dtype=dt),
                                                         torch.tensor([[True, False]]), mode="token-mean")))
    lo = float(torch.tensor(1.0 / (1.0 + 1e-8), dtype=torch.float64).to(dt))
    assert_that(lo <= got <= 1.0, "ISR-AGG-1", got, f"token-mean of one token of loss 1 in [{lo!r}, 1]")


@pytest.mark.clause("ISR-AGG-1", "ISR-STAB-1")
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_a_half_precision_mean_is_summed_wider(isreshape, mode):
    """Two float16 losses of 40000 average to 40000 (a float16 value); their sum, 80000, is past float16's
    largest finite value (65504), so a mean summed in float16 comes out inf."""
    require_dtype(torch.float16)
    loss = torch.full((1, 2), 40000.0, dtype=torch.float16)
    got = torch.as_tensor(isreshape.aggregate_loss(loss, torch.ones(1, 2, dtype=torch.bool), mode=mode))
    assert_close(got.float(), 40000.0, "ISR-AGG-1", dtype=torch.float16, what=f"{mode} of float16 losses")


@pytest.mark.clause("ISR-AGG-1")
def test_aggregate_unknown_mode_is_rejected(isreshape):
    dt = working_dtype()
    assert_rejects("ISR-AGG-1", isreshape.raw("aggregate_loss"), torch.ones(1, 2, dtype=dt),
                   torch.ones(1, 2, dtype=torch.bool), mode="seq-mean")


@pytest.mark.clause("ISR-AGG-1", "ISR-INPUT-1")
@pytest.mark.parametrize("mode", MODES)
def test_aggregate_empty_mask_rejected_or_zero_never_nan(isreshape, mode):
    dt = working_dtype()
    loss, mask = torch.ones(2, 3, dtype=dt), torch.zeros(2, 3, dtype=torch.bool)
    try:
        got = isreshape.raw("aggregate_loss")(loss, mask, mode=mode)
    except Exception:  # noqa: BLE001 - rejecting the empty mask is the clause's first choice
        return
    assert_that(bool(torch.as_tensor(got).eq(0).all()), "ISR-INPUT-1", got,
                "an error, or exactly 0, for a mask that selects no token (never NaN)")
