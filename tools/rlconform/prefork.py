"""Imported last by the runner's forkserver (:mod:`rlconform.launch`), after what it preloads: start-up work
that every forked child would otherwise repeat.

- The spec's YAML is parsed once (about 0.3 s per child audit otherwise); an invalid spec is left for the
  child to report.
- Hypothesis draws the literal constants of the project's modules more often. It finds them by scanning
  every module in ``sys.modules`` the first time a test draws, and remembers which modules it has scanned:
  about 0.3 s of each child audit when every child starts from scratch. Scanned here once, a child scans
  only its own test modules (which Hypothesis skips). The scan's cache goes to a temporary directory, never
  to the caller's working directory. A Hypothesis release that moves this private function costs speed,
  never a result: each child scans as before.
"""
from __future__ import annotations

import tempfile

from hypothesis import configuration

from rlconform.spec import SpecError, default_spec

try:
    from hypothesis.internal.conjecture.providers import _get_local_constants
except ImportError:  # private: moved or gone in another Hypothesis release
    _get_local_constants = None


def _scan_local_constants() -> None:
    if _get_local_constants is None:
        return
    with tempfile.TemporaryDirectory(prefix="rlconform-prefork-") as home:
        configuration.set_hypothesis_home_dir(home)
        try:
            _get_local_constants()
        finally:
            configuration.set_hypothesis_home_dir(None)


def _parse_spec() -> None:
    try:
        default_spec()
    except SpecError:
        pass


_parse_spec()
_scan_local_constants()  # last: the spec's modules are scanned too
