"""The runner's launcher: a child forked from the warm forkserver behaves as a fresh ``python -m`` would."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from rlconform import launch

pytestmark = pytest.mark.meta

PROBE = """
import json, os, sys, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"),
                  "path0": sys.path[0], "stdin": sys.stdin.read()}), flush=True)
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
    env = {**os.environ, "PROBE_VALUE": "from the caller"}
    if not warm:  # outside every warm() block, as `rlconform audit` runs
        monkeypatch.setitem(launch._state, "depth", 0)
    with launch.warm() if warm else contextlib.nullcontext():
        proc = launch.start([sys.executable, "-m", "launch_probe", "a b", "7"], cwd=probe, env=env,
                            stdout=tmp_path / "out.txt", stderr=tmp_path / "err.txt")
        assert isinstance(proc, launch.Forked) == warm
        assert proc.wait(60) == 7 and proc.returncode == 7
    import json

    got = json.loads((tmp_path / "out.txt").read_text().splitlines()[0])
    assert got == {"argv": ["a b", "7"], "cwd": str(probe), "env": "from the caller", "path0": str(probe), "stdin": ""}
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
