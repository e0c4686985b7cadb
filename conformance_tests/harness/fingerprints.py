"""What an operation is handed and how the suite tells whether it changed it: snapshots of the
arguments, the copies the operation receives, and fingerprints compared before and after the call.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from conformance_tests.harness.device import map_leaves


def _snapshot_leaf(x: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    c = x.detach().clone()
    return c.requires_grad_() if x.requires_grad and x.is_leaf and c.is_floating_point() else c


def _snapshot(x: Any) -> Any:
    """A detached copy of every tensor in ``x`` (lists, tuples and dicts walked), for repros and checks."""
    return map_leaves(_snapshot_leaf, x)


def _hand(x: Any) -> Any:
    """What the operation receives: a copy of each tensor that stays connected to autograd.

    Parameters are state the operation may legitimately update (their ``.grad``), so they pass as
    they are; their values are still checked against the snapshot afterwards.
    """
    return map_leaves(lambda v: v.clone() if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)
                      else v, x)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.device.type == "meta":
        return True  # a meta tensor has no values to compare
    a = a.detach().to(b.device)
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


_UNCOMPARABLE = object()


def _fingerprint(x: Any) -> Any:
    """A copy of what ``x`` holds, for comparing before and after a call: tensors (values), containers
    (walked, plain values copied), modules (each parameter's value and gradient, each buffer), optimisers
    (their state and hyper-parameters)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, torch.nn.Module):
        return {**{f"{k}": _fingerprint(v) for k, v in x.named_buffers()},
                **{k: _fingerprint(p) for k, p in x.named_parameters()},
                **{f"{k}.grad": None if p.grad is None else _fingerprint(p.grad) for k, p in x.named_parameters()}}
    if isinstance(x, torch.optim.Optimizer):
        return {"state": [_fingerprint(dict(x.state.get(p, {}))) for g in x.param_groups for p in g["params"]],
                "param_groups": [_fingerprint({k: v for k, v in g.items() if k != "params"}) for g in x.param_groups]}
    if isinstance(x, dict):
        return {k: _fingerprint(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_fingerprint(v) for v in x) if type(x) in (list, tuple) else [_fingerprint(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return x
    try:
        return copy.deepcopy(x)
    except Exception:  # noqa: BLE001 - an object that cannot be copied (a connection) is not compared
        return _UNCOMPARABLE


def _changed(now: Any, was: Any, path: str) -> str | None:
    """The first place where ``now`` differs from ``was`` (``batch['obs']``, ``critic['q1.weight.grad']``)."""
    if was is _UNCOMPARABLE or now is _UNCOMPARABLE:
        return None
    if isinstance(was, torch.Tensor) or isinstance(now, torch.Tensor):
        same = isinstance(was, torch.Tensor) and isinstance(now, torch.Tensor) and _same(now, was)
        return None if same else path
    if isinstance(was, dict) and isinstance(now, dict):
        if set(was) != set(now):
            return f"{path} (keys)"
        return next((m for k in was if (m := _changed(now[k], was[k], f"{path}[{k!r}]"))), None)
    if isinstance(was, (list, tuple)) and isinstance(now, (list, tuple)):
        if len(was) != len(now):
            return f"{path} (length)"
        return next((m for i, (n, w) in enumerate(zip(now, was)) if (m := _changed(n, w, f"{path}[{i}]"))), None)
    try:
        return None if bool(now == was) or (now != now and was != was) else path  # NaN equals NaN here
    except Exception:  # noqa: BLE001 - values without an equality (arrays of another kind) are not compared
        return None
