"""The InfoNCE negative queue (seed 000, §5 (2) and the QueueK of §8)."""
from __future__ import annotations

import torch

from reference_impl import _checks


def nce_queue_push(queue: torch.Tensor, keys: torch.Tensor, *, capacity: int) -> torch.Tensor:
    r"""First in, first out: append the new (detached) keys after the queued ones and keep the newest
    ``capacity`` rows, so the oldest keys leave first.

    .. math:: \mathcal{N} \leftarrow \mathrm{last}_K\big([\mathcal{N};\ \mathrm{sg}(\bar f(x))]\big)

    Implements: SAC-NCE-4.
    """
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"[SAC-NCE-4] capacity must be a positive int, got {capacity!r}")
    if queue.dim() != 2 or keys.dim() != 2 or queue.shape[1] != keys.shape[1]:
        raise ValueError(f"[SAC-NCE-4] queue [K,d] and keys [n,d] must share d; got {tuple(queue.shape)} "
                         f"and {tuple(keys.shape)}")
    _checks.finite(keys, "SAC-NCE-4", "keys")
    return torch.cat([queue.detach(), keys.detach().to(queue.dtype)], 0)[-capacity:]
