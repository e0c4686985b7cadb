"""The runner's launcher: a child forked from the warm forkserver behaves as a fresh ``python -m`` would."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from rlconform import launch

pytestmark = pytest.mark.meta

PROBE = """
import json, os, sys, tempfile, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"),
                  "path0": sys.path[0], "stdin": sys.stdin.read(), "tmp": tempfile.gettempdir()}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if "--child" in sys.argv:  # a grandchild that would outlive its parent unless the group is killed
    import subprocess
    grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(grand.pid, flush=True)
    time.sleep(60)
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
"""


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "launch_probe.py").write_text(PROBE, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("warm", [True, False], ids=["forked", "fresh"])
def test_a_child_gets_its_argv_directory_environment_and_files(probe, tmp_path, warm, monkeypatch):
    (tmp_path / "own tmp").mkdir()  # TMPDIR too: the forkserver has long chosen its temporary directory
    env = {**os.environ, "PROBE_VALUE": "from the caller", "TMPDIR": str(tmp_path / "own tmp")}
    if not warm:  # outside every warm() block, as `rlconform audit` runs
        monkeypatch.setitem(launch._state, "depth", 0)
    with launch.warm() if warm else contextlib.nullcontext():
        proc = launch.start([sys.executable, "-m", "launch_probe", "a b", "7"], cwd=probe, env=env,
                            stdout=tmp_path / "out.txt", stderr=tmp_path / "err.txt")
        assert isinstance(proc, launch.Forked) == warm
        assert proc.wait(60) == 7 and proc.returncode == 7

    got = json.loads((tmp_path / "out.txt").read_text().splitlines()[0])
    assert got == {"argv": ["a b", "7"], "cwd": str(probe), "env": "from the caller", "path0": str(probe), "stdin": "",
                   "tmp": str(tmp_path / "own tmp")}
    assert (tmp_path / "err.txt").read_text() == "to stderr\n"


def test_run_captures_both_streams_and_the_exit_code(probe, tmp_path):
    with launch.warm():
        done = launch.run([sys.executable, "-m", "launch_probe", "3"], cwd=probe, timeout=60, tmp=tmp_path)
    assert done.returncode == 3 and '"argv": ["3"]' in done.stdout and done.stderr == "to stderr\n"
    assert not list(tmp_path.glob("run-*")), "the captured output files are left behind"


def test_kill_ends_the_child_and_its_grandchildren(probe, tmp_path):
    with launch.warm():
        proc = launch.start([sys.executable, "-m", "launch_probe", "--child"], cwd=probe, env=dict(os.environ),
                            stdout=tmp_path / "out.txt")
        grand = int(_lines(tmp_path / "out.txt", 3)[2])  # after the JSON line and the stderr line
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.2)
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
    deadline = time.time() + 10
    while _alive(grand) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(grand), "the grandchild outlived the killed child"


def test_an_interrupt_reaches_the_child_as_keyboard_interrupt(probe, tmp_path):
    (probe / "wait_probe.py").write_text(
        "import time\ntry:\n    print('ready', flush=True); time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('interrupted', flush=True); raise SystemExit(130)\n", encoding="utf-8")
    with launch.warm():
        proc = launch.start([sys.executable, "-m", "wait_probe"], cwd=probe, env=dict(os.environ),
                            stdout=tmp_path / "out.txt")
        _lines(tmp_path / "out.txt", 1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    assert (tmp_path / "out.txt").read_text().split() == ["ready", "interrupted"]


def _lines(path, n: int, timeout: float = 60) -> list[str]:
    """The first ``n`` lines the child wrote to ``path``, once it has written them."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"{path} has fewer than {n} lines after {timeout:g} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie no one reaped yet is dead
        return f.read().split()[2] != "Z"


def test_a_forked_child_starts_with_the_spec_parsed_and_the_constants_scanned(probe, tmp_path):
    """What rlconform.prefork did once in the forkserver, a forked child does not do again."""
    (probe / "prefork_probe.py").write_text(
        "import json\nfrom hypothesis.internal.conjecture import providers\nfrom rlconform.spec import default_spec\n"
        "print(json.dumps({'spec': default_spec.cache_info().currsize, 'scanned': len(providers._seen_modules)}))\n",
        encoding="utf-8")
    with launch.warm():
        done = launch.run([sys.executable, "-m", "prefork_probe"], cwd=probe, timeout=120, tmp=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["spec"] == 1 and got["scanned"] > 100, got  # torch alone brings hundreds of modules


def test_the_constants_scan_writes_nothing_where_the_caller_works(tmp_path, monkeypatch):
    from hypothesis import configuration
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.constants_ast import constants_from_module
    from rlconform import prefork

    home = tmp_path / ".hypothesis"  # Hypothesis's default: the working directory it was imported in
    monkeypatch.setattr(configuration, "__hypothesis_home_directory_default", home)
    monkeypatch.setattr(configuration, "__hypothesis_home_directory", None)
    monkeypatch.setattr(providers, "_seen_modules", set())  # as in a fresh forkserver: nothing scanned yet
    monkeypatch.setattr(providers, "_sys_modules_len", None)
    constants_from_module.cache_clear()  # its per-module memo: each module is read (and its cache written) again
    prefork._scan_local_constants()
    assert providers._seen_modules and not home.exists()
    assert configuration.__hypothesis_home_directory is None  # the children choose their own again
