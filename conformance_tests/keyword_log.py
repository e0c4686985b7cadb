"""A pytest plugin that records the keyword values the clause tests pass to each contract operation.

``-p conformance_tests.keyword_log`` with ``RLCONFORM_KEYWORD_LOG=FILE``: at the end of the session FILE holds
``{"family.op": {keyword: [repr of each value passed]}}`` (an object that is not a plain value is
``"<object>"``). :func:`rlconform.coverage.keyword_coverage` reads it: a keyword the tests only ever pass at
its default cannot tell an operation that honours it from one that ignores it. One process only (no xdist):
each worker would hold a part.
"""
from __future__ import annotations

import json
import os

from conformance_tests.harness import proxy

ENV = "RLCONFORM_KEYWORD_LOG"
_PLAIN = (bool, int, float, str, type(None))
_SEEN: dict[str, dict[str, set[str]]] = {}


def _record(name: str, kwargs: dict) -> None:
    for key, value in kwargs.items():
        shown = repr(value) if isinstance(value, _PLAIN) else "<object>"
        _SEEN.setdefault(name, {}).setdefault(key, set()).add(shown)


def pytest_configure(config):
    base = proxy.call_op

    def call_op(fn, name, args, kwargs, *, wrap_errors):
        _record(name, kwargs)
        return base(fn, name, args, kwargs, wrap_errors=wrap_errors)

    proxy.call_op = call_op
    config.add_cleanup(lambda: setattr(proxy, "call_op", base))


def pytest_sessionfinish(session):
    path = os.environ.get(ENV)
    if path:
        log = {op: {k: sorted(v) for k, v in kws.items()} for op, kws in sorted(_SEEN.items())}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(log, f, indent=1)
