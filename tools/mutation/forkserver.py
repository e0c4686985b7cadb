"""A warm pytest fork server for mutation runs, and its client (the mutmut runner).

Starting pytest costs seconds per mutant, almost all of it importing torch and hypothesis. The server
imports the third-party modules a test run needs once, then forks a fresh child per request: the child
runs ``pytest.main`` in the snapshot and imports ``reference_impl`` / ``conformance_tests`` itself, from
disk, so it sees the mutant mutmut just wrote. Nothing of ours is ever imported in the server.

    python forkserver.py serve SOCKET TREE TESTFILE...    # run.py starts it (discovers what to preload)
    python forkserver.py run SOCKET PYTEST-ARGS...        # the runner mutmut calls: exit code = pytest's

A client that cannot reach the server runs pytest itself, so a dead server makes the run slower, never
wrong. A client that goes away (mutmut's timeout) makes the server kill that child's process group.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile

OURS = ("reference_impl", "conformance_tests", "rlconform", "mutmut_config", "test_", "__main__", "tools", "site")


def _child_pytest(args: list[str], out_path: str, modules_path: str | None = None) -> None:
    """In a forked child: run pytest, optionally record the imported modules, and _exit with its code."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 3
    try:
        import pytest

        code = int(pytest.main(list(args)))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - any crash is a failed run
        code = 3
    finally:
        if modules_path:
            with open(modules_path, "w") as f:
                f.write("\n".join(sorted(sys.modules)))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _preload(tree: str, test_files: list[str], out_path: str) -> int:
    """Collect the test files in a child, then import here every third-party module that child used."""
    with tempfile.NamedTemporaryFile("r", suffix=".modules", delete=False) as tmp:
        path = tmp.name
    pid = os.fork()
    if pid == 0:
        _child_pytest(["--collect-only", "-q", *test_files], out_path, path)
    os.waitpid(pid, 0)
    names = [n for n in open(path).read().split() if not n.startswith(OURS)]
    os.unlink(path)
    loaded = 0
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            loaded += 1
        except BaseException:  # noqa: BLE001 - a module that cannot be imported standalone is skipped
            pass
    return loaded


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def serve(sock_path: str, tree: str, test_files: list[str]) -> None:
    os.chdir(tree)
    sys.path.insert(0, tree)  # as `python -m pytest` run from the snapshot: its packages win
    out_path = os.path.join(os.path.dirname(sock_path), "last-test-run.log")
    n = _preload(tree, test_files, out_path)
    print(f"forkserver: preloaded {n} modules; serving on {sock_path}", flush=True)
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(1)
    while True:
        conn, _ = srv.accept()
        with conn:
            request = json.loads(conn.makefile().readline())
            pid = os.fork()
            if pid == 0:
                srv.close()
                conn.close()
                _child_pytest(request["args"], out_path)
            code = None
            while code is None:
                readable, _, _ = select.select([conn], [], [], 0.2)
                if readable and not conn.recv(1):  # the client went away (timeout): end the run
                    _kill_group(pid)
                    break
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    code = os.waitstatus_to_exitcode(status)
            if code is not None:
                try:
                    conn.sendall(f"{code}\n".encode())
                except OSError:
                    pass


def run(sock_path: str, args: list[str]) -> int:
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(sock_path)
    except OSError:
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *args])  # no server: plain pytest
    client.sendall((json.dumps({"args": args}) + "\n").encode())
    reply = client.makefile().readline().strip()
    if not reply:  # the server died mid-run: do not guess, run it here
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *args])
    code = int(reply)
    return code if code >= 0 else 1


if __name__ == "__main__":
    mode, sock = sys.argv[1], sys.argv[2]
    if mode == "serve":
        serve(sock, sys.argv[3], sys.argv[4:])
    else:
        sys.exit(run(sock, sys.argv[3:]))
