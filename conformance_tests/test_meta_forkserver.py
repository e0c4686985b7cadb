"""Meta-tests of the fork server (rlconform.forkserver): a forked run behaves as the ``subprocess.Popen``
it stands in for, and nothing that goes wrong around it (a killed caller, a dead server, a module that
cannot be preloaded) leaves a run hanging or changes its result.

The server preloads only ``json`` here and runs a small probe module, so the file takes about a second.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap

import pytest

from rlconform.forkserver import ForkServer, WarmChild

pytestmark = pytest.mark.meta
LIMIT = 30.0  # seconds a pipe may stay silent before a test fails instead of hanging (runs take milliseconds)

PROBE = textwrap.dedent('''
    """What a run of the fork server sees, and runs that end in each way a test command can end."""
    import json, os, subprocess, sys, time

    PRELOADED = set(sys.modules)  # before this module imports anything the server did not

    def sleep():
        try:  # from "ready" on: the caller may interrupt as soon as it reads it
            print("ready", flush=True)
            time.sleep(300)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            raise

    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "report":
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "name": __name__,
                          "no_bytecode": sys.dont_write_bytecode, "preloaded": [m for m in rest if m in PRELOADED]}))
        print("to stderr", file=sys.stderr)
    elif mode == "exit":  # the parent tells a forked run (the server's pid) from a plain one
        print(os.getppid(), flush=True)
        sys.exit(int(rest[0]))
    elif mode == "raise":
        1 / 0
    elif mode == "sleep":
        sleep()
    elif mode == "spawn":  # a grandchild holding the same stdout, as an xdist worker would
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        sleep()
    elif mode == "plain-unless-forked-by":
        if os.getppid() == int(rest[0]):
            sleep()
        print("plain", flush=True)
        sys.exit(5)
''')


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("forkserver")
    (d / "probe.py").write_text(PROBE, encoding="utf-8")
    (d / "explodes.py").write_text("raise RuntimeError('cannot be imported')\n", encoding="utf-8")
    (d / "pkgx").mkdir()
    (d / "pkgx" / "__init__.py").write_text("", encoding="utf-8")
    (d / "pkgx" / "sub.py").write_text("", encoding="utf-8")
    (d / "pkgxother.py").write_text("", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def server(probe_dir):
    # PYTHONUNBUFFERED empty: the server's own stdout is block-buffered whatever the caller's setting, so
    # only a run's -u can make its output unbuffered
    with ForkServer(["json"], env={"RLCONFORM_TEST_SERVER_ONLY": "1", "PYTHONUNBUFFERED": ""}, cwd=probe_dir) as s:
        yield s


def _probe(*argv: str) -> list[str]:
    return [sys.executable, "-m", "probe", *argv]


def _start(server: ForkServer, probe_dir, *argv: str, **kw) -> WarmChild:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return server.popen(_probe(*argv), cwd=probe_dir, **kw)


def _read(fd: int, until: bytes = b"") -> bytes:
    """Read a pipe until ``until`` has arrived, or (``until=b""``) until every process holding its write
    end has ended. A writer that does neither within LIMIT seconds fails the test rather than hanging it."""
    data = b""
    while not (until and until in data):
        ready, _, _ = select.select([fd], [], [], LIMIT)
        assert ready, f"the pipe is still held open by a live process; read so far: {data!r}"
        chunk = os.read(fd, 4096)
        if not chunk:
            assert not until, f"the run ended before printing {until!r}: {data!r}"
            break
        data += chunk
    return data


def _sleeping(server: ForkServer, probe_dir, mode: str = "sleep") -> tuple[WarmChild, int]:
    """A run that has printed ``ready`` and sleeps, and the read end of its stdout (caller closes it)."""
    r, w = os.pipe()
    try:
        child = _start(server, probe_dir, mode, stdout=w, stderr=w)
    finally:
        os.close(w)  # the run holds its own copy: EOF on r means the run (and its children) ended
    _read(r, b"ready\n")
    return child, r


# ----------------------------------------------------------------------------- what a run gets
def test_the_request_argv_cwd_and_env_reach_the_run_and_nothing_of_the_servers(server, probe_dir, tmp_path):
    env = {"PATH": os.environ["PATH"], "ONLY_THIS": "yes"}
    out = tmp_path / "out"
    with open(out, "w") as f:
        child = _start(server, probe_dir, "report", "a b", "--x", stdout=f, stderr=subprocess.STDOUT, env=env)
        assert child.wait() == 0
    err, line = sorted(out.read_text().splitlines(), key=lambda ln: ln.startswith("{"))  # buffered stdout comes last
    seen = json.loads(line)
    assert seen["argv"][1:] == ["report", "a b", "--x"] and seen["argv"][0] == str(probe_dir / "probe.py")
    assert seen["name"] == "__main__"
    assert seen["cwd"] == str(probe_dir)
    assert seen["env"] == env  # RLCONFORM_TEST_SERVER_ONLY, in the server's environment, did not leak
    assert err == "to stderr"  # stderr=STDOUT: the same file


def test_stdout_and_stderr_go_to_the_files_given(server, probe_dir, tmp_path):
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        assert _start(server, probe_dir, "report", stdout=out, stderr=err).wait() == 0
    assert json.loads((tmp_path / "out").read_text())["name"] == "__main__"
    assert (tmp_path / "err").read_text() == "to stderr\n"


@pytest.mark.parametrize("flag", ["1", None])
def test_the_requests_bytecode_setting_holds_whatever_the_servers(server, probe_dir, tmp_path, flag):
    """PYTHONDONTWRITEBYTECODE is read at interpreter start, i.e. the server's: a mutant's bytecode must
    never be cached because the server was started without it (or kept when a run asks for it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if flag:
        env["PYTHONDONTWRITEBYTECODE"] = flag
    with open(tmp_path / "out", "w") as out:
        assert _start(server, probe_dir, "report", stdout=out, env=env).wait() == 0
    assert json.loads((tmp_path / "out").read_text())["no_bytecode"] is bool(flag)


@pytest.mark.parametrize("argv, code, stderr", [(["exit", "0"], 0, ""), (["exit", "3"], 3, ""),
                                                 (["raise"], 1, "ZeroDivisionError")])
def test_the_exit_code_is_the_runs(server, probe_dir, tmp_path, argv, code, stderr):
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        child = _start(server, probe_dir, *argv, stdout=out, stderr=err)
        assert child.wait() == code == child.returncode == child.poll()
    assert stderr in (tmp_path / "err").read_text()


C_RUN = ("import os, sys; print(__name__, sys.argv, repr(sys.path[0]), os.getppid()); "
         "sys.stdout.write('unbuffered\\n'); sys.stdin.readline(); sys.exit(int(sys.argv[1]))")


def test_a_dash_c_run_is_the_interpreters_and_dash_u_leaves_stdout_unbuffered(server, probe_dir):
    """``python -u -c CODE ARGS``, as execnet starts an xdist worker: a fresh ``__main__``, argv[0] ``-c``, the
    working directory first on the path, and (-u) what it writes arrives while it still runs: this run
    waits for a line on stdin after writing, so a buffered stdout would never show it."""
    (r_out, w_out), (r_in, w_in) = os.pipe(), os.pipe()
    try:
        child = server.popen([sys.executable, "-u", "-c", C_RUN, "7", "x y"], cwd=probe_dir, stdin=r_in,
                             stdout=w_out, stderr=w_out)
    finally:
        os.close(w_out), os.close(r_in)
    got = _read(r_out, b"unbuffered\n").decode()
    os.write(w_in, b"go\n")
    os.close(w_in), os.close(r_out)
    assert child.wait(LIMIT) == 7
    assert got.splitlines()[0] == f"__main__ ['-c', '7', 'x y'] '' {server.pid}"


def test_xdist_workers_of_a_warm_audit_fork_from_its_server(server):
    """The ``--tx popen//python=...`` command the audit gives xdist (rlconform.audit._worker_python) is
    understood by execnet and starts a gateway forked by the server that answers."""
    execnet = pytest.importorskip("execnet")
    from rlconform.audit import _worker_python

    gw = execnet.makegateway(f"popen//python={_worker_python(server)}")
    try:
        assert gw.remote_exec("import os; channel.send(os.getppid())").receive(LIMIT) == server.pid
    finally:
        gw.exit()


# ----------------------------------------------------------------------------- ending a run
def test_wait_with_a_timeout_raises_and_kill_ends_the_whole_process_group(server, probe_dir):
    child, r = _sleeping(server, probe_dir, "spawn")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.05)
        assert child.poll() is None
        child.kill()
        assert child.wait() == -signal.SIGKILL
        _read(r)  # EOF: the grandchild that shared the run's stdout is gone too
    finally:
        os.close(r)


def test_sigint_is_a_keyboard_interrupt_in_the_run(server, probe_dir):
    child, r = _sleeping(server, probe_dir)
    try:
        child.send_signal(signal.SIGINT)
        assert child.wait() == 130
        assert _read(r) == b"interrupted\n"
    finally:
        os.close(r)


@pytest.mark.parametrize("end", ["close", "kill"])
def test_a_server_that_closes_or_dies_ends_its_runs_and_they_report_it(probe_dir, end):
    server = ForkServer(["json"], cwd=probe_dir)
    child, r = _sleeping(server, probe_dir)
    try:
        if end == "close":
            server.close()
        else:
            os.kill(server.pid, signal.SIGKILL)
        assert child.wait(timeout=LIMIT) == -signal.SIGKILL
        assert child.lost  # the code says nothing about the run: a caller must not take it as its verdict
        _read(r)
    finally:
        os.close(r)
        server.close()


# ----------------------------------------------------------------------------- preloading
def test_a_module_that_cannot_be_preloaded_leaves_the_server_working(probe_dir, tmp_path):
    with ForkServer(["json", "explodes", "no_such_module_anywhere"], cwd=probe_dir) as server, \
            open(tmp_path / "out", "w") as out:
        child = _start(server, probe_dir, "report", "json", "explodes", stdout=out, stderr=subprocess.DEVNULL)
        assert child.wait() == 0
    assert json.loads((tmp_path / "out").read_text())["preloaded"] == ["json"]


def test_excluded_packages_are_never_preloaded_and_the_servers_own_is_dropped(server, probe_dir, tmp_path):
    names = ["pkgx", "pkgx.sub", "pkgxother", "rlconform"]

    def preloaded(s: ForkServer) -> list[str]:
        with open(tmp_path / "out", "w") as out:
            assert _start(s, probe_dir, "report", *names, stdout=out).wait() == 0
        return json.loads((tmp_path / "out").read_text())["preloaded"]

    with ForkServer(["pkgx.sub", "pkgxother"], cwd=probe_dir) as plain:
        assert preloaded(plain) == names  # rlconform: the server runs as `python -m rlconform.forkserver`
    with ForkServer(["pkgx.sub", "pkgxother"], exclude=["pkgx", "rlconform"], cwd=probe_dir) as excluding:
        assert preloaded(excluding) == ["pkgxother"]  # a package, not a name prefix, is excluded


# ----------------------------------------------------------------------------- the command-line client
def _client(sock: str, *argv: str, cwd, **kw) -> subprocess.Popen:
    """``python -m rlconform.forkserver run SOCK -- python -m probe ARGV...``, as mutmut starts it."""
    return subprocess.Popen([sys.executable, "-m", "rlconform.forkserver", "run", sock, "--", *_probe(*argv)],
                            cwd=cwd, stdin=subprocess.DEVNULL, **kw)


def test_the_client_exits_with_the_runs_code_forked_by_the_server(server, probe_dir):
    proc = _client(server.sock, "exit", "3", cwd=probe_dir, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=LIMIT)
    assert proc.returncode == 3
    assert int(out) == server.pid


def test_without_a_server_the_client_becomes_the_run(probe_dir, tmp_path):
    proc = _client(str(tmp_path / "no-such.sock"), "exit", "3", cwd=probe_dir, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=LIMIT)
    assert proc.returncode == 3
    assert int(out) == os.getpid()  # exec'd, not a grandchild: whoever kills the client kills the run


def test_killing_the_client_ends_its_run(server, probe_dir):
    """mutmut's timeout kills the runner command: the forked run must not outlive it."""
    r, w = os.pipe()
    try:
        proc = _client(server.sock, "spawn", cwd=probe_dir, stdout=w, stderr=w)
    finally:
        os.close(w)
    try:
        _read(r, b"ready\n")
        proc.kill()
        proc.wait()
        _read(r)  # EOF: the run and its grandchild ended with the client
    finally:
        os.close(r)


def test_a_server_that_dies_mid_run_makes_the_client_run_it_again_itself(probe_dir):
    server = ForkServer(["json"], cwd=probe_dir)
    r, w = os.pipe()
    try:
        proc = _client(server.sock, "plain-unless-forked-by", str(server.pid), cwd=probe_dir, stdout=w,
                       stderr=subprocess.PIPE)
    finally:
        os.close(w)
    try:
        _read(r, b"ready\n")  # forked by the server: it sleeps
        os.kill(server.pid, signal.SIGKILL)
        assert _read(r) == b"plain\n"  # run again outside the server, to its end
        assert proc.wait(timeout=LIMIT) == 5
        assert "died during the run" in proc.stderr.read().decode()
    finally:
        os.close(r)
        proc.stderr.close()
        server.close()


def test_a_run_that_ends_before_its_caller_reads_the_pid_keeps_its_exit_code(tmp_path):
    """The server may reap a quick run and send "exit N" before the caller has read "pid N": both lines
    then arrive in one read, and the exit code must not be mistaken for the pid (the run would look lost
    and be run a second time)."""
    import socket
    import threading

    from rlconform.forkserver import start_child

    sock_path = str(tmp_path / "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(1)

    def fake_server():
        conn, _ = listener.accept()
        _, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        for fd in fds:
            os.close(fd)
        conn.sendall(b"pid 4242\nexit 3\n")
        conn.close()

    th = threading.Thread(target=fake_server, daemon=True)
    th.start()
    try:
        child = start_child(sock_path, [sys.executable, "-m", "probe"], stdin=subprocess.DEVNULL)
        assert (child.pid, child.wait(timeout=LIMIT), child.lost) == (4242, 3, False)
    finally:
        th.join(LIMIT)
        listener.close()
