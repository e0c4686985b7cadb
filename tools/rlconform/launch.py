"""How the runner starts a ``python -m MODULE ...`` child: a fresh interpreter, or forked from the standard
library's forkserver once the caller asks for warm children.

A fresh interpreter spends about 3 s importing torch, hypothesis and the suite before a test runs; one
mutant's tests take well under a second. Inside :func:`warm`, children are forked from
:mod:`multiprocessing`'s forkserver, which imported :data:`PRELOAD` once (``set_forkserver_preload``), then
:mod:`rlconform.prefork` (the spec parsed, Hypothesis's constant scan done), so a child starts in
milliseconds. The forkserver never runs a torch operation before it forks, so no OpenMP pool is forked
half-started. Clause-test modules are never preloaded, so pytest still rewrites their assertions (a caller
may preload a test module that a child only imports as an implementation's module, as the meta-tests do).

Either way the caller gets a handle with ``subprocess.Popen``'s ``pid``, ``poll``, ``wait(timeout)``,
``send_signal``, ``terminate``, ``kill`` and ``returncode``, and the child gets the command line, working
directory and environment it asked for, stdin from /dev/null, and its output appended to a file.
"""
from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Sequence

# What a child audit imports before its test modules. A module missing here is imported by each child:
# slower, never different.
PRELOAD = ("torch", "torch._dynamo",  # the optimizers' first step imports dynamo: about 1 s per training test
           "numpy", "scipy.optimize", "scipy.differentiate", "hypothesis", "pytest", "_hypothesis_pytestplugin",
           "xdist.plugin", "conformance_tests.plugin", "conformance_tests.runtime", "conformance_tests.harness",
           "conformance_tests.oracles", "conformance_tests.stdb_backends", "rlconform.spec",
           *(f"{pkg}.{family}" for pkg in ("conformance_tests.strategies", "conformance_tests.contract",
                                           "conformance_tests.mutants", "reference_impl")
             for family in ("sac", "ppo", "isreshape", "ccapo")))

_state = {"depth": 0, "preload": list(PRELOAD), "context": None}
_lock = threading.Lock()
_counter = itertools.count()  # names of captured-output files


@contextlib.contextmanager
def warm(extra: Iterable[str] = ()):
    """While the block runs, :func:`start` forks ``python -m`` children from the forkserver (started on first
    use, with :data:`PRELOAD` and ``extra`` imported; it lives as long as this process). ``extra`` counts only
    before the server starts: name everything at the outermost block."""
    with _lock:
        _state["depth"] += 1
        for m in extra:
            if m not in _state["preload"]:
                _state["preload"].append(m)
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1


def _context():
    with _lock:
        if _state["context"] is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([*_state["preload"], "rlconform.prefork"])  # last: after every import
            _state["context"] = ctx
        return _state["context"]


def prepare() -> None:
    """Inside :func:`warm`, start the forkserver now and wait until it has imported everything (a no-op child
    comes back), so that its start-up is not charged to the first child's time limits; elsewhere nothing."""
    if _state["depth"] and not _state.get("ready"):
        proc = _context().Process(target=_noop)
        proc.start()
        proc.join()
        _state["ready"] = True


def _noop() -> None:
    pass


def _module_argv(args: Sequence[str]) -> tuple[str, list[str]] | None:
    """(module, argv) of ``[this python, "-m", module, *argv]``; None for any other command."""
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m":
        return args[2], list(args[3:])
    return None


def start(args: Sequence[str], *, cwd: str | os.PathLike, env: dict[str, str], stdout: str | os.PathLike,
          stderr: str | os.PathLike | None = None):
    """Start ``args`` with output appended to ``stdout`` (and ``stderr``, default the same file): forked
    inside :func:`warm` when ``args`` is ``python -m MODULE ...``, else a new process."""
    parsed = _module_argv(args)
    if _state["depth"] and parsed is not None:
        proc = _context().Process(target=_child_main, args=(*parsed, str(cwd), dict(env), str(stdout),
                                                             str(stderr or stdout)), daemon=False)
        proc.start()
        return Forked(proc, list(args))
    out = open(stdout, "a", encoding="utf-8")
    err = out if stderr is None or Path(stderr) == Path(stdout) else open(stderr, "a", encoding="utf-8")
    try:
        return subprocess.Popen(list(args), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT if err is out else err)
    finally:  # the child holds its own copies
        out.close()
        err.close()


def _child_main(module: str, argv: list[str], cwd: str, env: dict[str, str], stdout: str, stderr: str) -> None:
    """In the forked child: become ``python -m module *argv`` as a fresh interpreter would start it."""
    os.setpgid(0, 0)  # its own group: kill() ends its grandchildren too (xdist workers, torchrun ranks)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, path, flags in ((0, os.devnull, os.O_RDONLY), (1, stdout, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                                (2, stderr, os.O_WRONLY | os.O_APPEND | os.O_CREAT)):
        fd = os.open(path, flags, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # the forkserver's cached choice: a fresh interpreter reads the child's TMPDIR
    sys.path.insert(0, cwd)  # what ``python -m`` puts first
    sys.argv = [module, *argv]  # argv[0] becomes the module's file, as with ``python -m``
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class Forked:
    """A forked child behind the part of :class:`subprocess.Popen`'s interface the runner uses."""

    def __init__(self, process, args: list[str]):
        self._process, self.args, self.pid, self.returncode = process, args, process.pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        try:  # the child's whole group; before it made the group, the child alone
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(args: Sequence[str], *, cwd, env: dict | None = None, timeout: float,
        tmp: str | os.PathLike) -> subprocess.CompletedProcess:
    """As ``subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, through
    :func:`start` (so forked inside :func:`warm`); ``tmp``: a directory for the captured output."""
    n = next(_counter)
    out, err = Path(tmp) / f"run-{os.getpid()}-{n}.out", Path(tmp) / f"run-{os.getpid()}-{n}.err"
    proc = start(args, cwd=cwd, env=dict(os.environ if env is None else env), stdout=out, stderr=err)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    texts = [p.read_text(encoding="utf-8", errors="replace") if p.exists() else "" for p in (out, err)]
    for p in (out, err):
        p.unlink(missing_ok=True)
    return subprocess.CompletedProcess(list(args), code, *texts)

