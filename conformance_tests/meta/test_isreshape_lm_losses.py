"""The LM trainer's token reductions (reference_impl/isreshape/lm/losses.py) against numpy: the mean over
response tokens, its rescaling of a plain mean, the no-clip importance-sampling baseline and the ratio
statistics. Masks with one response token and none are the edges the clamps exist for."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_close
from reference_impl.isreshape.lm import losses

pytestmark = pytest.mark.meta
F64 = torch.float64
MASKS = {
    "ragged": [[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]],
    "one token": [[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]],
}


def _case(name: str):
    g = torch.Generator().manual_seed(11)
    mask = torch.tensor(MASKS[name], dtype=torch.bool)
    return torch.randn(mask.shape, generator=g, dtype=F64) * 2, mask


@pytest.mark.clause("ISR-AGG-1")
@pytest.mark.parametrize("name", MASKS)
def test_token_means_are_the_mean_over_response_tokens(name):
    x, mask = _case(name)
    want = float(x.numpy()[mask.numpy()].mean())
    assert_close(losses.masked_mean(x, mask), want, "ISR-AGG-1", what="masked_mean")
    zeroed = torch.where(mask, x, 0.0)
    assert_close(losses.as_token_mean(zeroed.mean(), mask), want, "ISR-AGG-1", what="as_token_mean of a plain mean")
    assert_close(losses.masked_mean(x, torch.zeros_like(mask)), 0.0, "ISR-AGG-1", what="no response token")


@pytest.mark.clause("ISR-RATIO-1")
@pytest.mark.parametrize("name", MASKS)
def test_the_no_clip_baseline_is_minus_the_mean_of_r_times_a(name):
    """L = −Σ r A m / Σ m with r = exp(clamp(log π − log π_ref, ±20)); its gradient in log π is −r A m / n.
    One token's log-ratio is 20.5, past the default clamp."""
    adv, mask = _case(name)
    logp = torch.full_like(adv, -1.0)
    ref = logp - torch.linspace(-1.0, 1.0, adv.numel(), dtype=F64).view_as(adv)
    ref[mask.nonzero()[0].tolist()] = -21.5  # log-ratio 20.5: clamped to 20
    x = logp.clone().requires_grad_()
    loss = losses.importance_sampling_loss(x, ref, adv, mask)
    d = np.clip((logp - ref).numpy(), -20.0, 20.0)
    r, m, a = np.exp(d), mask.numpy(), adv.numpy()
    assert_close(loss, -float((r * a)[m].mean()), "ISR-RATIO-1", what="no-clip loss")
    loss.backward()
    live = np.abs((logp - ref).numpy()) < 20.0  # the clamp's flat part passes no gradient
    assert_close(x.grad, np.where(m & live, -r * a / m.sum(), 0.0), "ISR-RATIO-1", what="its gradient")


@pytest.mark.clause("ISR-METRIC-1")
@pytest.mark.parametrize("name", MASKS)
def test_ratio_statistics_are_over_response_tokens(name):
    r, mask = _case(name)
    r = r.exp()
    got = losses.ratio_stats(r, mask)
    on = r.numpy()[mask.numpy()]
    assert_close(got["ratio_std"], float(on.std()), "ISR-METRIC-1", what="population std")
    assert_close(got["ratio_min"], float(on.min()), "ISR-METRIC-1", what="min")
    assert_close(got["ratio_max"], float(on.max()), "ISR-METRIC-1", what="max")
    assert math.isfinite(float(got["ratio_std"]))
