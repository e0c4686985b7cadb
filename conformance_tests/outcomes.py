"""The vocabulary of one test's result, which the suite writes and every runner reads."""
from __future__ import annotations

# Outcomes of one test. ``not_run``: selected but never executed (interrupted, or skipped after a hang).
# ``deviation``: passed, but only with an oracle that follows a convention the implementation declares
# otherwise than the seed (spec/conventions.yaml); the record's ``deviations`` say which.
OUTCOMES = ("pass", "deviation", "fail", "error", "timeout", "expected_fail", "xpass", "not_applicable", "skipped",
            "not_run")
# Kinds of test, by how much a failure tells a reader: a hand-computed golden value first, a property last.
KIND_RANK = {"golden": 0, "example": 1, "property": 2}
