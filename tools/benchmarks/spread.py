"""How much the rounds of an interleaved benchmark disagree (no torch: the page renderer reads it too)."""
from __future__ import annotations

BUSY_SPREAD = 0.15  # above this, more than one round of a contender was disturbed: the median may be too


def round_spread(times: dict[str, list[float]]) -> float:
    """The largest slowest/fastest - 1 over the contenders, each contender's single fastest and slowest
    round left out when it has five or more (one disturbed round does not move a median of five, so it
    should not flag the run either). On a quiet machine it stays within a few per cent; another job
    sharing the cores for part of the run shows up here before it shows up in the ratio."""
    def spread(t: list[float]) -> float:
        s = sorted(t)
        s = s[1:-1] if len(s) >= 5 else s
        return s[-1] / s[0] - 1.0 if s and s[0] > 0 else 0.0
    return max(map(spread, times.values()), default=0.0)
