"""A warm process that starts ``python -m MODULE ...`` (and ``python -c CODE ...``) runs by forking, and a
Popen-like handle on each run.

Starting pytest on the suite costs about 3 s per child process, almost all of it importing torch,
hypothesis and our packages; the tests of one mutant or one meta-test audit take well under a second.
The server imports those modules once and then forks one child per request, so a child starts in
milliseconds. The handle behaves like :class:`subprocess.Popen` where :func:`rlconform.audit.run_suite`
uses it (``poll``, ``wait(timeout)``, ``send_signal``, ``kill``, ``returncode``), so the audit's watchdog,
Ctrl-C handling and event stream work unchanged.

Why a separate server rather than forking the caller: the caller (a pytest worker, a trainer) has run
torch operations, and a child forked after OpenMP started its thread pool can hang. The server only
imports: it never runs an operation before it forks.

What a child gets, as ``subprocess.Popen(argv, cwd=..., env=..., stdin=..., stdout=..., stderr=...)`` would
give it: the argv, working directory and environment of the request, and the caller's own file descriptors
(passed over the Unix socket), default signal handlers, its own process group (``kill`` ends its
grandchildren too, e.g. xdist workers) and a fresh ``random`` seed. Test modules and conftest files are
never preloaded, so pytest still rewrites their assertions. The packages named in ``exclude`` are never
preloaded either, and dropped from the server before it forks, so every child imports them afresh from
disk: mutation testing rewrites our own packages between runs (tools/mutation/run.py).

    python -m rlconform.forkserver serve SOCKET CONFIG_JSON        # started by ForkServer, never by hand
    python -m rlconform.forkserver run SOCKET -- python -m MODULE ...  # exit code = the run's (or -c CODE)

``run`` is a client for callers that can only start a command (mutmut's runner): it sends its own stdin,
stdout, stderr, working directory and environment. A server it cannot reach, or one that dies mid-run,
makes it run the command itself: slower, never a different result.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import random
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import IO, Any, Iterable, Sequence

_READY = "forkserver ready"
_MAX_FDS = 3


class ForkServerError(RuntimeError):
    """The server could not be started, or did not take a run (the caller falls back to plain subprocesses)."""


# ----------------------------------------------------------------------------- the server process
def _is_test_module(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest" or last.endswith("_test")


def _excluded(name: str, prefixes: Sequence[str]) -> bool:
    """``name`` is one of the packages ``prefixes`` or inside one (``rlconform`` covers ``rlconform.cli``,
    not ``rlconformx``)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _child_main(request: dict, fds: list[int]) -> None:
    """In a forked child: become the requested ``python -m`` or ``-c`` run, then _exit with its code."""
    code = 1
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM, signal.SIGPIPE, signal.SIGHUP):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # read at interpreter start, so the request's value must be applied by hand (mutation runs set it:
        # a mutant's bytecode must never be cached)
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        random.seed()
        flags, kind, target, args = _parse_run(request["argv"])
        if "-B" in flags:
            sys.dont_write_bytecode = True
        if "-u" in flags:  # unbuffered stdout and stderr, as the interpreter's -u gives them
            sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=f.encoding,
                                                       errors=f.errors, write_through=True)
                                      for fd, f in ((1, sys.stdout), (2, sys.stderr)))
        if kind == "-m":
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:  # -c: a fresh __main__, the working directory first on the path (''), as the interpreter does
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(target, "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - reported as Python would, exit 1
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


_FLAGS = ("-u", "-B")  # interpreter flags a run may carry before -m / -c (execnet starts `python -u -c CODE`)


def _parse_run(argv: Sequence[str]) -> tuple[set[str], str, str, list[str]]:
    """``python [-u] [-B] -m MODULE ARGS...`` or ``python [-u] [-B] -c CODE ARGS...`` -> (flags, "-m" or "-c",
    MODULE or CODE, ARGS); a ValueError for any other command."""
    i = 1
    while i < len(argv) and argv[i] in _FLAGS:
        i += 1
    if i + 1 < len(argv) and argv[i] in ("-m", "-c"):
        return set(argv[1:i]), argv[i], argv[i + 1], list(argv[i + 2:])
    raise ValueError(f"the fork server runs `python [-u] [-B] -m MODULE ...` or `-c CODE ...` only, not {list(argv[:4])}")


def _runnable(argv: Sequence[str]) -> bool:
    """A command the server can run (see :func:`_parse_run`)."""
    try:
        _parse_run(argv)
    except ValueError:
        return False
    return True


def _preload(modules: Sequence[str], discover: Sequence[str] | None, exclude: Sequence[str] = ()) -> int:
    """Import ``modules``, then (``discover``: pytest arguments) every module a forked ``pytest
    --collect-only`` with those arguments imports, test modules, conftest files and ``exclude`` excepted."""
    names = list(modules)
    if discover is not None:
        with tempfile.NamedTemporaryFile("r", suffix=".modules", delete=False) as tmp:
            path = tmp.name
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)
                import pytest

                code = int(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *discover]))
                Path(path).write_text("\n".join(sorted(sys.modules)), encoding="utf-8")
            finally:
                os._exit(code)
        os.waitpid(pid, 0)
        names += Path(path).read_text(encoding="utf-8").split()
        os.unlink(path)
    loaded = 0
    for name in names:
        if name in sys.modules or _is_test_module(name) or name == "__main__" or _excluded(name, exclude):
            continue
        try:
            importlib.import_module(name)
            loaded += 1
        except BaseException:  # noqa: BLE001 - a module that cannot be imported on its own is left to the child
            pass
    return loaded


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _read_request(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """The request and the caller's fds; None for a caller that went away before sending all of it."""
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, _MAX_FDS)
    while msg and not msg.endswith(b"\n"):  # a long environment arrives in pieces
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        msg += chunk
    if not msg.endswith(b"\n"):
        return None, fds
    return json.loads(msg.decode("utf-8")), fds


def serve(sock_path: str, config: dict) -> None:
    """Preload, announce readiness on stdout, then fork one child per connection until stdin closes
    (the creator ended or died: the server then kills its children and exits)."""
    exclude = config.get("exclude", ())
    n = _preload(config.get("modules", ()), config.get("discover"), exclude)
    for target in config.get("call", ()):  # warm caches the children share (e.g. the parsed spec)
        module, _, name = target.partition(":")
        getattr(importlib.import_module(module), name)()
    # what got in anyway (this server's own package, a call's imports) is imported again by each child
    for name in [m for m in sys.modules if _excluded(m, exclude)]:
        del sys.modules[name]
    gc.freeze()  # what the server holds stays out of every child's collections (pytest forces several)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(16)
    print(f"{_READY}: {n} modules preloaded", flush=True)
    children: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
    exits: dict[int, int] = {}  # pid -> a pidfd, readable once the child exits (reaped at once, not at the next tick)
    while True:
        conns = list(children.values())
        readable, _, _ = select.select([listener, sys.stdin, *conns, *exits.values()], [], [],
                                       0.1 if len(exits) < len(children) else 1.0)
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1024):
            for pid in children:
                _kill_group(pid)
            return
        for conn in conns:  # a caller that went away: its run ends too
            if conn in readable and not conn.recv(64):
                pid = next(p for p, c in children.items() if c is conn)
                _kill_group(pid)
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = _read_request(conn)
            if request is None:
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                for c in (conn, *conns):
                    c.close()
                _child_main(request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"pid {pid}\n".encode())
            children[pid] = conn
            with contextlib.suppress(AttributeError, OSError):  # pidfds: Linux >= 5.3
                exits[pid] = os.pidfd_open(pid)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if pid in exits:
                os.close(exits.pop(pid))
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()


# ----------------------------------------------------------------------------- the caller's side
class WarmChild:
    """A run forked by the server: the part of :class:`subprocess.Popen` the audit uses. ``lost``: the
    server died during the run (which was then killed, so ``returncode`` says nothing about the run)."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str], received: bytes = b""):
        self._conn, self.pid, self.args = conn, pid, args
        self.returncode: int | None = None
        self.lost = False
        self._buf = b""
        self._add(received)

    def _take(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        data = self._conn.recv(64)
        if not data:  # the server died under its child: end the child too, report it killed
            _kill_group(self.pid)
            self.returncode, self.lost = -signal.SIGKILL, True
            self._conn.close()
        self._add(data)

    def _add(self, data: bytes) -> None:
        self._buf += data
        if self._buf.endswith(b"\n") and self.returncode is None:
            self.returncode = int(self._buf.split()[-1])
            self._conn.close()

    def poll(self) -> int | None:
        self._take(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._take(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """The child and its process group (xdist workers, a forked helper)."""
        if self.returncode is None:
            _kill_group(self.pid)

    def __enter__(self) -> WarmChild:
        return self

    def __exit__(self, *exc) -> None:
        if self.returncode is None:
            self.kill()
            self.wait()


def start_child(sock_path: str, args: Sequence[str], *, cwd: str | os.PathLike | None = None,
                env: dict[str, str] | None = None, stdin: IO | int | None = None, stdout: IO | int | None = None,
                stderr: IO | int | None = None) -> WarmChild:
    """Ask the server listening on ``sock_path`` for a run; see :meth:`ForkServer.popen`. Raises
    :class:`ForkServerError` when no server answers there."""
    def fd(stream, default: int) -> int:
        if stream is None:
            return default
        if stream == subprocess.DEVNULL:
            return os.open(os.devnull, os.O_RDWR)
        if isinstance(stream, int) and stream < 0:  # PIPE, or STDOUT other than as stderr
            raise ValueError(f"a fork server run takes a file, an fd, DEVNULL or (as stderr) STDOUT, not {stream}")
        return stream if isinstance(stream, int) else stream.fileno()

    out = fd(stdout, 1)
    err = out if stderr == subprocess.STDOUT else fd(stderr, 2)
    fds = [fd(stdin, 0), out, err]
    request = {"argv": [str(a) for a in args], "cwd": str(cwd or os.getcwd()),
               "env": dict(os.environ if env is None else env)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
        socket.send_fds(conn, [json.dumps(request).encode("utf-8") + b"\n"], fds)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(64)
            if not chunk:
                raise ForkServerError("the fork server closed the connection before starting the run")
            reply += chunk
    except OSError as e:
        conn.close()
        raise ForkServerError(f"the fork server at {sock_path} did not take the run: {e}") from e
    except ForkServerError:
        conn.close()
        raise
    finally:
        if stdin == subprocess.DEVNULL:
            os.close(fds[0])
    # a run that ended at once may have its "exit N" line in the same read: it belongs to the child
    first, _, rest = reply.partition(b"\n")
    return WarmChild(conn, int(first.split()[-1]), list(request["argv"]), received=rest)


class ForkServer:
    """One warm server; :meth:`popen` starts a run in it. Use as a context manager, or :meth:`close`.

    ``env`` is added to the server's environment (and so to what it preloads under); ``cwd`` is its
    working directory (``discover`` paths are relative to it); ``exclude``: package names the server
    never holds (see the module docstring)."""

    def __init__(self, modules: Iterable[str] = (), *, discover: Sequence[str] | None = None,
                 call: Iterable[str] = (), exclude: Iterable[str] = (), env: dict[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, start_timeout: float = 300.0):
        self._dir = tempfile.mkdtemp(prefix="rlconform-fork-")
        self.sock = os.path.join(self._dir, "sock")
        config = {"modules": list(modules), "discover": None if discover is None else list(discover),
                  "call": list(call), "exclude": list(exclude)}
        # in the process environment, not set later: the interpreter reads some of it at start-up only
        self._proc = subprocess.Popen([sys.executable, "-m", "rlconform.forkserver", "serve", self.sock,
                                       json.dumps(config)], cwd=cwd, env={**os.environ, **(env or {})},
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        seen = []
        while True:
            ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = self._proc.stdout.readline() if ready else ""
            if line.startswith(_READY):
                break
            seen.append(line)
            if not ready or not line:
                self.close()
                raise ForkServerError("the fork server did not start:\n" + "".join(seen)[-2000:])

    def popen(self, args: Sequence[str], *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
              stdin: IO | int | None = None, stdout: IO | int | None = None,
              stderr: IO | int | None = None) -> WarmChild:
        """As ``subprocess.Popen(args, ...)`` for ``args = [python, "-m", module, ...]`` (the server's own
        interpreter runs it, whatever ``args[0]`` names); ``stderr=STDOUT`` and ``stdin=DEVNULL`` are
        understood, ``PIPE`` is not."""
        return start_child(self.sock, args, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)

    @property
    def pid(self) -> int:
        """The server process: the parent of every run."""
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_group(self._proc.pid)
                self._proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.sock)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ----------------------------------------------------------------------------- the command-line client
def client(sock_path: str, argv: list[str]) -> int:
    """Run ``argv`` in the server at ``sock_path`` with this process's stdio, cwd and environment and
    return its exit code as a shell gives it (128 + N for a run ended by signal N). A command that is
    not ``python -m ...`` or ``-c ...``, or a server that cannot be reached or dies mid-run, is exec'd here instead,
    so that whoever kills this process (mutmut's timeout) kills the run itself."""
    child = None
    if _runnable(argv):
        with contextlib.suppress(ForkServerError):
            child = start_child(sock_path, argv)
    if child is not None:
        # Ctrl-C reaches only this process group: pass it on as a shell would; SIGKILL needs no handler,
        # as the server kills a run whose client went away
        def forward(sig: int, _frame: Any) -> None:
            if sig == signal.SIGINT:
                child.send_signal(sig)
            else:
                child.kill()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, forward)
        code = child.wait()
        if not child.lost:
            return code if code >= 0 else 128 - code
        print(f"rlconform.forkserver: the server at {sock_path} died during the run; running it again here",
              file=sys.stderr, flush=True)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"rlconform.forkserver: cannot run {argv[0]!r}: {e}", file=sys.stderr)
        return 127


_USAGE = ("usage: python -m rlconform.forkserver run SOCKET -- COMMAND...\n"
          "       python -m rlconform.forkserver serve SOCKET CONFIG_JSON   (started by ForkServer)")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "serve":
        serve(argv[1], json.loads(argv[2]))
        return 0
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        return client(argv[1], argv[3:])
    print(_USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
