"""Input guards shared by every family: bad input raises a ValueError that names the clause.

Each guard reads a value back to the host, so it synchronises a GPU stream; trainers that have
validated their pipeline can turn the guards off for the hot loop with :func:`validation`.
"""
from __future__ import annotations

import contextlib

import torch

_ENABLED = [True]


@contextlib.contextmanager
def validation(enabled: bool):
    """Temporarily switch the guards on or off (they are on by default)."""
    old = _ENABLED[0]
    _ENABLED[0] = enabled
    try:
        yield
    finally:
        _ENABLED[0] = old


def _on() -> bool:
    return _ENABLED[0]


def finite(x: torch.Tensor, clause: str, name: str) -> None:
    if _on() and x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"[{clause}] {name} contains NaN or inf")


def same_shape(clause: str, **tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"[{clause}] shapes differ: {shapes}")


def has_fields(batch: dict, keys, clause: str) -> None:
    """A batch lacking any of ``keys`` is refused by name, not with a KeyError deep inside (no device read)."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ValueError(f"[{clause}] batch lacks field(s) {missing}")


def bool_mask(mask: torch.Tensor, clause: str, name: str = "legal_mask") -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"[{clause}] {name} must be a bool tensor, got {mask.dtype}")


def rows_nonempty(mask: torch.Tensor, clause: str, name: str = "legal_mask") -> None:
    if _on() and not bool(mask.any(-1).all()):
        raise ValueError(f"[{clause}] {name} has a row with no legal action")


def in_range(value: float, lo: float, hi: float, clause: str, name: str, *, lo_open=True, hi_open=False) -> None:
    """lo < value <= hi by default; the open/closed ends are chosen per clause."""
    v = float(value)
    ok_lo = v > lo if lo_open else v >= lo
    ok_hi = v < hi if hi_open else v <= hi
    if not (ok_lo and ok_hi):
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"[{clause}] {name}={value!r} is outside {lb}{lo}, {hi}{rb}")


def index_in_range(idx: torch.Tensor, size: int | torch.Tensor, clause: str, name: str) -> None:
    if _on() and bool(((idx < 0) | (idx >= size)).any()):
        raise IndexError(f"[{clause}] {name} has an index outside [0, {int(size) if not isinstance(size, torch.Tensor) else 'len'})")
