"""Type promotion said out loud, for code that torch's implicit promotion does not reach."""
from __future__ import annotations

import functools

import torch


def promoted(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in their common dtype, as torch's arithmetic promotes them (float32 network outputs
    against a float64 reward, say). Needed where a computation writes into a buffer in place or calls an
    op that refuses mixed dtypes (``scatter_add_``, ``linalg.vecdot``), or whose backward does
    (``huber_loss``); tensors already of that dtype are returned as they are."""
    if all(t.dtype == tensors[0].dtype for t in tensors):  # the usual case, and no dispatch (promote_types is an op)
        return tensors
    dt = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return tuple(t if t.dtype == dt else t.to(dt) for t in tensors)
