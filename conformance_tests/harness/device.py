"""The audited device: building inputs on it, reading results back to the host, and the walkers over
nested lists, tuples and dicts that both use.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch

from conformance_tests import simdevice
from conformance_tests.harness import state
from conformance_tests.harness.state import session_device, simulated


# Every input is built on the audited device through these helpers, and every result comes back through
# :func:`host`: a test never makes a generator, a network or an optimiser of its own on the CPU, and never
# calls ``.numpy()``, ``.item()`` or ``.tolist()`` on a result (``--device sim`` refuses each).
def generator(seed: int) -> torch.Generator:
    """A generator on the audited device, seeded with ``seed`` (streams differ between devices)."""
    if simulated():
        return simdevice.generator(seed)
    return torch.Generator(device=session_device()).manual_seed(seed)


def on_device(x: Any) -> Any:
    """``x`` on the audited device: a module (moved in place and returned, so build its optimiser after),
    a tensor, or a list/tuple/dict of them (autograd still reaches host leaves)."""
    dev = session_device()
    if isinstance(x, torch.nn.Module):
        return x.to(dev)
    if isinstance(x, torch.Tensor):
        return x if x.device == torch.device(dev) else x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(on_device(v) for v in x)
    if isinstance(x, dict):
        return {k: on_device(v) for k, v in x.items()}
    return x


def device_leaf(t: torch.Tensor) -> torch.Tensor:
    """A leaf copy of ``t`` on the audited device that requires grad (a temperature, a parameter-like input)."""
    return on_device(t.detach()).detach().requires_grad_(True)


def map_leaves(fn: Callable[[Any], Any], x: Any) -> Any:
    """``x`` with ``fn`` applied to every leaf of its nested lists, tuples and dicts (the containers rebuilt):
    the one walker behind the harness's copies, moves and casts (:func:`named_leaves` reads leaves)."""
    if isinstance(x, (list, tuple)):
        return type(x)(map_leaves(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: map_leaves(fn, v) for k, v in x.items()}
    return fn(x)


def named_leaves(x: Any, where: str = "") -> Iterable[tuple[str, Any]]:
    """(path, leaf) for every leaf of nested lists, tuples and dicts, paths written as Python indexes
    (``where[0]['key']``)."""
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from named_leaves(v, f"{where}[{i}]")
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from named_leaves(v, f"{where}[{k!r}]")
    else:
        yield where, x


def _leaves(x: Any) -> Iterable[Any]:
    return (leaf for _, leaf in named_leaves(x))


def host(x: Any) -> Any:
    """A result on the host: every tensor detached and on the CPU (lists, tuples, dicts walked), for numpy,
    ``float`` or a message. The only way the suite reads a device result."""
    return map_leaves(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, x)


def to_numpy(x: Any) -> np.ndarray:
    """A result (or a plain value) as a numpy array on the host; half precision widened to float32."""
    return _to_numpy(x)


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _to_device(x: Any) -> Any:
    """Tensor arguments on the session's --device (autograd still reaches the CPU leaves). Modules are the
    test's to build on the device (:func:`on_device`): moving them here would hide a network built on the host."""
    if state._STATE["device"] == "cpu":
        return x
    return map_leaves(lambda v: v if isinstance(v, torch.nn.Module) else on_device(v), x)
