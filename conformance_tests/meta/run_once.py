"""A costly fixture value built once per test run, even when pytest-xdist spreads its tests over workers.

A module- or session-scoped fixture is per *process*: with ``-n auto`` each worker that runs one of its
tests builds it again (a docs site build, a three-defect audit: tens of seconds each). Here the first
worker builds the value under a file lock in the run's shared temporary directory and stores it; the
others wait on the lock and load it.
"""
from __future__ import annotations

import contextlib
import os
import pickle
from pathlib import Path
from typing import Any, Callable


def run_dir(tmp_path_factory) -> Path:
    """A directory of this test run that every xdist worker of it shares (the run's own one without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once_per_run(tmp_path_factory, name: str, build: Callable[[Path], Any]) -> Any:
    """``build(directory)`` run by one process of this test run; its (picklable) value for every process.
    A build that raises is not stored: the next process to ask builds again (and reports its own error)."""
    root = run_dir(tmp_path_factory) / f"run-once-{name}"
    root.mkdir(exist_ok=True)
    value_file = root / "value.pickle"
    with file_lock(root / "lock") as locked:
        if not locked:  # no lock between processes: each builds its own, in a directory of its own
            return build(tmp_path_factory.mktemp(name))
        if value_file.exists():
            return pickle.loads(value_file.read_bytes())
        value = build(root)
        tmp = value_file.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(value))
        tmp.replace(value_file)
        return value


@contextlib.contextmanager
def file_lock(path: Path, *, wait: bool = True):
    """An exclusive lock on ``path`` between processes for the block; yields whether it holds one (no
    ``fcntl``: not POSIX, False, and the caller must not share what it writes; ``wait=False``: also
    False at once when another holds it, this process included). Released when the file closes, also
    when the holder dies."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
