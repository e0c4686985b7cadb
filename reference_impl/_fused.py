"""What the fused fast paths of every family share: a loss whose gradients were computed with it."""
from __future__ import annotations

from typing import Sequence

import torch


class _WithGradients(torch.autograd.Function):
    """``value`` with the gradients of its ``n`` inputs given beside it (computed in closed form next to
    the value, so backward is this one node). Backward returns ``gradient · upstream``; where a fused path
    worked in a promoted dtype, autograd casts it to its input's dtype. The gradients are consumed (scaled
    in place): one backward per graph."""

    @staticmethod
    def forward(ctx, value, n, *inputs_then_grads):
        ctx.save_for_backward(*inputs_then_grads[n:])
        ctx.n = n
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        saved = ctx.saved_tensors  # read once: a second read would see them scaled in place, and refuse
        grads = [g.mul_(upstream) for g in saved]
        if len(saved) < ctx.n:  # one stacked gradient, scaled in one op
            grads = grads[0].unbind(0)
        return None, None, *grads, *(None for _ in saved)


def with_gradients(value: torch.Tensor, inputs: Sequence[torch.Tensor],
                   grads: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """``value`` (a scalar computed without autograd) made differentiable with respect to ``inputs``, with
    ``grads`` as ∂value/∂input: one per input, or for several inputs one tensor that stacks theirs along
    its first dimension."""
    grads = (grads,) if torch.is_tensor(grads) else tuple(grads)
    return _WithGradients.apply(value, len(inputs), *inputs, *grads)
