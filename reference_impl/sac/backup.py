"""Expected soft backup, Top-p selection and the TD target (seed 000, §6)."""
from __future__ import annotations

import torch

from reference_impl import _checks
from reference_impl._dtypes import promoted


def _min_q(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    return torch.minimum(q1, q2)  # SAC-V-1: pessimistic twin-Q


def _weighted_soft(pi: torch.Tensor, q: torch.Tensor, support: torch.Tensor, alpha) -> torch.Tensor:
    """Σ_{a∈support} π(a) [q(a) − α log π(a)], with entries off the support contributing exactly 0."""
    safe_log = torch.log(torch.where(support, pi, torch.ones_like(pi)))
    return torch.where(support, pi * (q - alpha * safe_log), torch.zeros_like(pi)).sum(-1)


def soft_value(probs, q1, q2, legal_mask, *, alpha) -> torch.Tensor:
    r""":math:`V_{soft}(s') = \sum_{a \in A(s')} \pi(a|o')\,[\min_i Q'_i(o',a) - \alpha \log \pi(a|o')]`.

    Implements: SAC-V-1.
    """
    _checks.same_shape("SAC-V-1", probs=probs, q1=q1, q2=q2, legal_mask=legal_mask)
    return _weighted_soft(probs, _min_q(q1, q2), legal_mask, alpha)


# ----------------------------------------------------------------------------- Top-p (SAC-TOPP-1..3)
# The rule, shared by both selection paths: legal actions are ranked by decreasing π, ties by lower
# action id; an action is kept iff the legal mass ranked before it is < p (so the action whose mass
# reaches p exactly is kept and the next one is not); p = 1 keeps the whole legal set. Masses are
# float64 sums, exact (hence order-free, so both paths agree bit for bit) whenever the values lie on
# a common dyadic grid, e.g. float32 probabilities >= 2^-27 such as ε-clipped ones.

def _select_sorted(pi: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    """The plain formula, kept as the oracle of the fast path: a stable sort (ties by lower column),
    then keep each legal action whose float64 mass before it is below p."""
    sorted_pi, order = torch.sort(pi, dim=-1, descending=True, stable=True)
    upto = torch.cumsum(sorted_pi, dim=-1, dtype=torch.float64)
    before = torch.cat([torch.zeros_like(upto[..., :1]), upto[..., :-1]], dim=-1)  # no subtraction: no rounding
    keep_sorted = (before < p) & torch.gather(legal_mask, -1, order)
    return torch.zeros_like(legal_mask).scatter(-1, order, keep_sorted)


_RADIX = 10  # key bits resolved per pass: a [B, 2^10 + 2] float64 histogram per pass
_LANES = 4  # histogram copies, filled by interleaved columns: equal keys (the ε-clipped tail, the
#             bucket below the window) then do not all add into one address, one after another
_KEYS = {torch.float32: (torch.int32, 30), torch.float64: (torch.int64, 62)}  # (int view, bits of keys of values < 2)


def _order_keys(probs: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Integer keys in the order of the probabilities (the bit patterns of non-negative floats sort
    like the floats; a -0.0 or a negative entry falls below every key), and the bit width of the keys
    of values below 2. A view of the input where possible: never written."""
    if probs.dtype not in _KEYS:
        probs = probs.float()  # half / bfloat16 widen exactly
    view, width = _KEYS[probs.dtype]
    return probs.detach().view(view), width


def _mass_threshold(keys: torch.Tensor, mass: torch.Tensor, width: int, p: float):
    """Radix select on mass. Per row: the largest key k with Σ_{key ≥ k} π ≥ p (the key of the action
    whose mass reaches p), the mass strictly above k, the row's whole mass, and a scratch buffer.
    Each pass sums π into 2^_RADIX buckets of the current key window (plus one below and one above
    it), then narrows the window to the highest bucket whose mass from the top still reaches p.
    No sort, no host sync."""
    (rows, cols), nb, dev = keys.shape, (1 << _RADIX) + 2, keys.device
    lane = torch.arange(cols, device=dev, dtype=keys.dtype) % _LANES * (rows * nb)
    offset = torch.arange(rows, device=dev, dtype=keys.dtype)[:, None] * nb + 1 + lane  # row, lane, past "below"
    lo = torch.zeros(rows, 1, device=dev, dtype=keys.dtype)
    idx = torch.empty_like(keys)  # bucket ids, rewritten in place each pass
    lanes = torch.empty(_LANES * rows * nb, dtype=torch.float64, device=dev)
    total = None
    for shift in range(width - _RADIX, -_RADIX, -_RADIX):
        shift = max(shift, 0)
        torch.sub(keys, lo, out=idx).bitwise_right_shift_(shift).clamp_(-1, 1 << _RADIX).add_(offset)
        lanes.zero_().index_add_(0, idx.view(-1), mass.view(-1))
        upper = lanes.view(_LANES, rows, nb).sum(0)[:, 1:]  # digits 0 .. 2^_RADIX - 1, then above the window
        upper_cum = upper.cumsum(-1)
        from_top = upper_cum[:, -1:] - upper_cum + upper  # [d]: mass of digits >= d, + above the window
        total = from_top[:, :1] if total is None else total
        digit = ((from_top[:, :-1] >= p).sum(-1, keepdim=True) - 1).clamp_(min=0)
        lo = lo + (digit.to(keys.dtype) << shift)
        above = from_top.gather(-1, digit + 1)
    return lo, above, total, idx


def _select_threshold(probs: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    """The set of :func:`_select_sorted`, found without sorting: the threshold key t, every legal
    action above it, and of the legal actions tied at t the m lowest ids, m = #{j ≥ 0 : above + j·t < p}.
    Illegal actions keep their keys but carry no mass, so t is always the key of a legal action."""
    keys, width = _order_keys(probs)
    mass = probs.detach().to(torch.float64, copy=True).mul_(legal_mask.view(torch.uint8))  # illegal: no mass (a bool
    # masked_fill is several times slower than a multiplication by the mask's bytes)
    key_t, above, total, scratch = _mass_threshold(keys, mass, width, p)
    t = key_t.view(torch.float32 if width == 30 else torch.float64).double()
    m = torch.ceil((p - above) / t)  # then exact corrections, as the division may round either way
    m = torch.where(above + (m - 1) * t >= p, m - 1, m)
    m = torch.where(above + m * t < p, m + 1, m)
    m = m.clamp_(max=keys.shape[-1]).to(keys.dtype)  # t = 0 only when the mass is short of p
    tie = (keys == key_t).logical_and_(legal_mask)
    rank = torch.cumsum(tie, dim=-1, dtype=keys.dtype, out=scratch)  # 1-based rank of a tie, in id order
    keep = (keys > key_t).logical_and_(legal_mask).logical_or_(tie.logical_and_(rank <= m))
    return torch.where(total < p, legal_mask, keep)  # legal mass short of p: every legal action


# ----------------------------------------------------------------------------- one plan per device
# The CPU plan works row block by row block (each elementwise pass reads a block still in cache, every
# temporary is small enough for the allocator to reuse) and finds the Top-p threshold by a radix search.
# The accelerator plan runs each pass once over the whole batch (a GPU wants few large kernels: the CPU
# plan launches thousands of tiny ones) and selects by a segmented sort, the plain formula. Both give the
# same sets and values (conformance_tests/meta/test_sac_fastpaths.py runs each against the plain formulas).

def blocked(t: torch.Tensor) -> bool:
    """Whether ``t``'s device takes the row-block plan (the CPU) rather than one pass over the batch."""
    return t.device.type == "cpu"


_CHUNK_BYTES = 1 << 23  # ~8 MB of float64 per row chunk: temporaries stay in the allocator's reused heap


def by_blocks(fn, blocks: list[slice], rows: int, *tensors):
    """``fn`` over the row slices ``blocks`` of ``tensors`` (rows first; None passes through), its outputs
    (a tuple, rows first) assembled into tensors of ``rows`` rows. With one block ``fn`` sees the whole
    tensors: no slice, no preallocated output and no copy (on an accelerator, each would be a launch)."""
    if len(blocks) == 1:
        return fn(*tensors)
    outs = None
    for r in blocks:
        part = fn(*(None if t is None else t[r] for t in tensors))
        if outs is None:
            outs = tuple(x.new_empty((rows, *x.shape[1:])) for x in part)
        for o, x in zip(outs, part):
            o[r] = x
    return outs


def _by_row_chunks(fn, *tensors: torch.Tensor) -> torch.Tensor:
    """fn over blocks of rows of [..., A] tensors, reassembled (rows are independent); on the CPU only.
    Small blocks keep every temporary below the size that glibc serves from fresh pages, which would
    cost more than the arithmetic."""
    lead, width = tensors[0].shape[:-1], tensors[0].shape[-1]
    flat = [t.reshape(-1, width) for t in tensors]
    rows, step = flat[0].shape[0], max(1, _CHUNK_BYTES // (8 * max(1, width)))
    if not blocked(flat[0]):
        step = max(rows, 1)
    blocks = [slice(i, min(i + step, rows)) for i in range(0, rows, step)] or [slice(0, 0)]
    (out,) = by_blocks(lambda *t: (fn(*t),), blocks, rows, *flat)
    return out.reshape(*lead, *out.shape[1:])


def _select(probs: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    """The Top-p set by the device's plan: the radix threshold search on the CPU, the sort elsewhere."""
    return _select_threshold(probs, legal_mask, p) if blocked(probs) else _select_sorted_legal(probs, legal_mask, p)


def _soft_value_expanded(probs, q1, q2, selected, alpha) -> torch.Tensor:
    """SAC-TOPP-3 in fewer passes: with w = π·1[P] and Z = Σ w,
    Σ_P π_p (q − α log π_p) = (Σ w q + α Σ entr(w)) / Z + α log Z, entr(w) = −w log w (0 at w = 0)."""
    w = probs.masked_fill(~selected, 0.0)
    z = w.sum(-1)
    wq, q = promoted(w, _min_q(q1, q2))  # vecdot refuses mixed dtypes
    return (torch.linalg.vecdot(wq, q) + alpha * torch.special.entr(w).sum(-1)) / z + alpha * torch.log(z)


def _check_top_p(probs: torch.Tensor, legal_mask: torch.Tensor, p: float, clause: str) -> None:
    _checks.in_range(p, 0.0, 1.0, "SAC-INPUT-3", "p")
    _checks.bool_mask(legal_mask, clause)
    _checks.same_shape(clause, probs=probs, legal_mask=legal_mask)


def _legal_probs(probs: torch.Tensor, legal_mask: torch.Tensor) -> torch.Tensor:
    return probs.detach().masked_fill(~legal_mask, 0.0)  # select among legal only


def _select_sorted_legal(probs: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    return _select_sorted(_legal_probs(probs, legal_mask), legal_mask, p)


def _select_threshold_by_chunks(probs: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    return _by_row_chunks(lambda pr, lm: _select_threshold(pr, lm, p), probs, legal_mask)


def _select_by_plan(probs: torch.Tensor, legal_mask: torch.Tensor, p: float) -> torch.Tensor:
    return _by_row_chunks(lambda pr, lm: _select(pr, lm, p), probs, legal_mask)


_METHODS = {"auto": _select_by_plan, "threshold": _select_threshold_by_chunks, "sorted": _select_sorted_legal}


def top_p_select(probs: torch.Tensor, legal_mask: torch.Tensor, *, p: float, method: str = "auto"
                 ) -> torch.Tensor:
    r"""The smallest legal set P with :math:`\sum_{a \in P} \pi(a) \ge p`, as a detached bool mask.

    Legal actions are ranked by decreasing probability, ties by lower action id; an action is kept
    iff the mass ranked before it is < p, so the action whose mass reaches p exactly is kept and the
    next one is not, and the set is never empty; p = 1 keeps every legal action. ``method``:
    "threshold" (a radix search for the threshold, linear in |A|: the CPU's), "sorted" (the plain
    sort + cumsum formula, the oracle: an accelerator's), or "auto" (default: the device's plan); all
    return the same set.

    Implements: SAC-TOPP-1 (bad input: SAC-INPUT-3).
    """
    _check_top_p(probs, legal_mask, p, "SAC-TOPP-1")
    if p >= 1.0:
        return legal_mask.clone()  # SAC-TOPP-1: p = 1 is no truncation, whatever the ε-clip adds
    return _METHODS[method](probs, legal_mask, p)


def top_p_probs(probs: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    r"""π_p ∝ π · 1[a ∈ P], renormalised to sum to one (differentiable through π).

    Implements: SAC-TOPP-2.
    """
    _checks.same_shape("SAC-TOPP-2", probs=probs, selected=selected)
    kept = torch.where(selected, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_p_soft_value(probs, q1, q2, legal_mask, *, alpha, p: float, method: str = "auto") -> torch.Tensor:
    r""":math:`\hat V_{soft}(s') = \sum_{a \in P} \pi_p(a)\,[\min_i Q'_i(o',a) - \alpha \log \pi_p(a)]`.

    Implements: SAC-TOPP-3.
    """
    selected = top_p_select(probs, legal_mask, p=p, method=method)
    if method == "sorted":  # the plain formula, the oracle of the expanded one
        return _weighted_soft(top_p_probs(probs, selected), _min_q(q1, q2), selected, alpha)
    return _by_row_chunks(lambda *t: _soft_value_expanded(*t, alpha), probs, q1, q2, selected)


def td_target(reward, done, next_value, *, gamma: float) -> torch.Tensor:
    r""":math:`y = r + \gamma\,(1 - \mathrm{done})\,\hat V_{soft}(s')`: no bootstrap through a terminal step.

    Implements: SAC-TD-1 (bad input: SAC-INPUT-4).
    """
    _checks.in_range(gamma, 0.0, 1.0, "SAC-INPUT-4", "gamma", hi_open=True)
    _checks.same_shape("SAC-TD-1", reward=reward, done=done, next_value=next_value)
    not_done = 1.0 - done.to(next_value.dtype)
    return reward + gamma * not_done * next_value.detach()
