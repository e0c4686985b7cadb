"""What the commands share: the one error that means "usage" (exit 2), output that survives a closed pipe, and
the audit progress display."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tqdm.auto import tqdm


class UsageError(Exception):
    """A bad argument or input file named on the command line: the command exits 2 with this message. Every
    other exception is a fault of rlconform itself and exits 4."""


def writable_dir(path: str, flag: str) -> Path:
    """``path`` as an existing directory this process can write into (created if need be), or a usage error
    that names ``flag``: found before any work starts, never as a traceback after it."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot create the directory ({e.strerror})") from None
    try:  # a file actually made: os.access says yes to root on a read-only mount, /proc or /sys
        fd, probe = tempfile.mkstemp(prefix=".rlconform-write-check-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: the directory is not writable ({e.strerror})") from None
    return out


def print_or_drop(text: str) -> None:
    """Print to stdout; if the reader has gone (`| tee` killed by the same Ctrl-C), drop stdout quietly."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit



class AuditProgress:
    """Audit progress: a bar on a terminal, plain lines (one per test file) otherwise."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.total = 0
        self.done = 0
        self.bad = 0
        self.file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._end()
        return False

    def _end(self):
        if self.bar is not None:
            self.bar.close()
        elif self.file:
            self._line()
        self.bar, self.total, self.done, self.bad, self.file = None, 0, 0, 0, None

    def _line(self):
        print(f"  [{self.done}/{self.total}] {self.file}: {self.bad} failing so far", file=sys.stderr, flush=True)

    def __call__(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "begin":  # a new run (the matrix audits one library after another)
            self._end()
        elif kind in ("collected", "collected_ids"):
            if self.total:  # xdist: every worker reports the same collection
                return
            self.total = len(ev["tests"]) if kind == "collected" else ev["count"]
            if self.tty:
                self.bar = tqdm(total=self.total, desc="audit", dynamic_ncols=True)
            else:
                print(f"rlconform audit: {self.total} tests selected", file=sys.stderr, flush=True)
        elif kind == "finish":
            fname = ev["nodeid"].split("::")[0].rsplit("/", 1)[-1]
            if self.bar is None and self.file and fname != self.file:
                self._line()  # one plain line per finished test file
            self.file = fname
            self.done += 1
            self.bad += ev.get("outcome") in ("fail", "error", "timeout")
            if self.bar is not None:
                self.bar.set_postfix_str(f"{fname} {','.join(ev.get('clauses', [])[:2])} failing={self.bad}")
                self.bar.update(1)
