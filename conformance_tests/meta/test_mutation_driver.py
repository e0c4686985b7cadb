"""The mutation tools. The driver's test command (tools/mutation/verdict.py): mutmut 2.5 counts a mutant killed
only on exit 1, so every failing pytest exit must become 1, a mutant that breaks the module's import included.
The driver's ``--until``. The hand-written trainer wiring mutants (tools/mutation/wiring.py): each still applies
to its trainer and has a recorded kill."""
from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.meta
REPO = Path(__file__).resolve().parents[2]

CASES = {
    "passing": ("def test_ok():\n    assert True\n", 0, 0),
    "failing": ("def test_bad():\n    assert False\n", 1, 1),
    "a module that no longer imports": ("import not_a_module_anywhere\n\ndef test_ok():\n    pass\n", 2, 1),
    "no tests": ("x = 1\n", 5, 1),
}


def _exit(tmp_path: Path, module: str, source: str) -> int:
    (tmp_path / "test_case.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", module, "-q", "-p", "no:cacheprovider", "test_case.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True).returncode


@pytest.mark.parametrize("case", CASES)
def test_every_failing_exit_is_a_kill(tmp_path, case):
    source, pytest_exit, verdict_exit = CASES[case]
    assert _exit(tmp_path, "pytest", source) == pytest_exit, "pytest's own exit code changed"
    assert _exit(tmp_path, "tools.mutation.verdict", source) == verdict_exit


def _tool(name: str):
    """tools/mutation/<name>.py, loaded as its scripts run (the folder is not a package)."""
    path = REPO / "tools" / "mutation" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"rlconform_mutation_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _driver():
    return _tool("run")


def test_the_driver_runs_the_tests_through_the_verdict():
    run = _driver()
    cfg = {"pytest_args": ["-x"], "modules": {"reference_impl/_clip.py": ["test_ppo_losses.py"]}}
    cmd = run.runner(cfg, "reference_impl/_clip.py", REPO)
    assert " -m tools.mutation.verdict -x conformance_tests/test_ppo_losses.py" in cmd


def test_each_module_runs_under_its_own_baseline_time(tmp_path):
    """mutmut keeps one baseline time per cache and stops a mutant's tests after 10x it (a "timeout", counted as
    detected): the driver writes each module's own measured time there before mutating it."""
    import sqlite3

    run = _driver()
    db = tmp_path / ".mutmut-cache"
    con = sqlite3.connect(db)
    with con:
        con.execute('CREATE TABLE "MiscData" ("key" TEXT NOT NULL PRIMARY KEY, "value" TEXT NOT NULL)')
        con.execute("INSERT INTO MiscData VALUES ('baseline_time_elapsed', '2.5'), ('version', '4')")
    con.close()
    run.set_mutmut_baseline(tmp_path, 41.0)
    con = sqlite3.connect(db)
    assert dict(con.execute("SELECT key, value FROM MiscData").fetchall()) == {"baseline_time_elapsed": "41.0",
                                                                                "version": "4"}
    con.close()
    run.set_mutmut_baseline(tmp_path / "fresh", 3.0)  # no cache yet: mutmut measures the module itself
    assert not (tmp_path / "fresh" / ".mutmut-cache").exists()


def test_a_baseline_is_measured_once_per_content_and_a_red_one_is_none(tmp_path, monkeypatch):
    run = _driver()
    calls = []

    def fake(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if "red" in kw["cwd"].name else 0, stdout="", stderr="")
    monkeypatch.setattr(run.subprocess, "run", fake)
    cfg = {"pytest_args": [], "modules": {"reference_impl/_clip.py": ["test_ppo_losses.py"]}, "env": {}}
    state = {"baselines": {}}
    green = tmp_path / "green"
    green.mkdir()
    first = run.baseline(cfg, "reference_impl/_clip.py", green, state)
    assert isinstance(first, float) and run.baseline(cfg, "reference_impl/_clip.py", green, state) == first
    assert len(calls) == 1, "the second call reads the cached time"
    key = next(iter(state["baselines"]))
    state["baselines"][key] = True  # a state written before the times were kept: measured again
    assert isinstance(run.baseline(cfg, "reference_impl/_clip.py", green, state), float) and len(calls) == 2
    red = tmp_path / "red"
    red.mkdir()
    assert run.baseline(cfg, "reference_impl/_clip.py", red, {}) is None


@pytest.mark.parametrize("until, expected", [
    ("23:30", dt.datetime(2026, 11, 27, 23, 30, tzinfo=dt.timezone.utc)),  # later today
    ("01:05", dt.datetime(2026, 11, 28, 1, 5, tzinfo=dt.timezone.utc)),  # past today: tomorrow's
    ("22:50", dt.datetime(2026, 11, 28, 22, 50, tzinfo=dt.timezone.utc)),  # now exactly: a day on, not 0 s
])
def test_until_is_the_next_occurrence(until, expected):
    now = dt.datetime(2026, 11, 27, 22, 50, tzinfo=dt.timezone.utc)
    assert _driver().parse_until(until, now) == expected


@pytest.mark.parametrize("bad", ["25:00", "noon", "1:2:3", "12:60"])
def test_a_bad_until_is_a_usage_error(tmp_path, bad):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "mutation" / "run.py"), "--until", bad,
                           "--modules", "reference_impl/_clip.py", "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--until wants a UTC time HH:MM" in proc.stderr
    assert not (tmp_path / "work").exists(), "a usage error must not have started a snapshot"


def _wiring():
    return _tool("wiring")


def _families():
    return _wiring().families()


@pytest.mark.parametrize("family", _families())
def test_every_wiring_mutant_still_applies_to_its_trainer(family):
    """A trainer edited under a hand-written mutant must bring the mutant along (tools/mutation/wiring_mutants/)."""
    wiring = _wiring()
    assert wiring.problems(wiring.load(family)) == []


@pytest.mark.parametrize("family", _families())
def test_every_wiring_mutant_has_a_recorded_kill(family):
    """<family>.results.json holds a kill for each mutant as <family>.yaml writes it now: rerun wiring.py after an
    edit."""
    wiring = _wiring()
    recorded = wiring.load_results(family)["mutants"]
    for m in wiring.load(family)["mutants"]:
        r = recorded.get(m["id"])
        assert r is not None, f"{m['id']}: never run"
        assert (r["edits"], r["file"], r.get("select")) == (wiring.edits(m), m["file"], m.get("select")), \
            f"{m['id']}: run on another text or test selection"
        assert r["verdict"] == "killed", f"{m['id']} survived the wiring tests"


def test_wiring_problems_name_a_mutant_that_no_longer_applies(tmp_path):
    wiring = _wiring()
    (tmp_path / "t.py").write_text("a = 1\na = 1\n")
    (tmp_path / "conformance_tests").mkdir()
    spec = {"tests": {"t.py": ["missing.py"]},
            "mutants": [{"id": "x", "file": "t.py", "old": "a = 1", "new": "a = 2"},
                        {"id": "x", "file": "t.py", "edits": [{"old": "a = 1\na", "new": "a = 3\na"},
                                                            {"old": "b", "new": "b"}]}]}
    found = wiring.problems(spec, tmp_path)
    assert any("occurs 2 times" in p for p in found) and any("occurs 0 times" in p for p in found)
    assert not any(p.startswith("x: its old text occurs 1") for p in found)  # the edit that is there once
    assert any("used twice" in p for p in found) and any("the same" in p for p in found)
    assert any("no test file missing.py" in p for p in found)


def test_the_page_marks_a_surviving_wiring_mutant():
    rows = _tool("render").render_wiring({"updated": "now", "mutants": {
        "a": {"file": "t.py", "bug": "lost done", "verdict": "killed", "killed_by": "x.py::test_one"},
        "b": {"file": "t.py", "bug": "late mask", "verdict": "survived", "killed_by": None}}})
    text = "\n".join(rows)
    assert "**1 of 2 killed**" in text and "| `t.py` | `b` | late mask | **survived** |" in text
    assert "| `t.py` | `a` | lost done | `test_one` |" in text


@pytest.mark.parametrize("line, message", [
    ('        raise ValueError(f"{name} must be finite")', True),
    ('            "got a mask of the wrong shape "', True),  # a message's continuation
    ("    f'{clause}: {what}'", True),
    ("    # a comment", True),
    ('    "gamma": 0.995,', False),  # a default: its value is what the clause fixes
    ('           "n_total_global": int(stats["n_total_global"]) + 1,', False),  # a fold's arithmetic
    ("    'clip_eps': 0.2,  # PPO-CLIP-1", False),
    ('            "approx_kl": losses.approx_kl(old_log_prob, new_log_prob),  # PPO-KL-1', False),
    ("    x = 1", False),
])
def test_the_hook_skips_message_lines_and_never_a_dict_entry(line, message):
    """A dict entry that opens with its key is code (a default, a diagnostic, a buffer): its mutants run."""
    spec = importlib.util.spec_from_file_location("mutmut_hook", REPO / "tools" / "mutation" / "mutmut_config.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook._is_message_line(line) is message


def test_a_verified_kill_of_a_mutant_mutmut_left_untested_counts_as_killed():
    """mutmut 2 may never run a mutant on a line that repeats in its module; a classification that names the test
    killing it, confirmed by --verify-kills on that very line, is its verdict. Unconfirmed, it stays untested."""
    render = _tool("render")
    line = "if _checks._on() and bool((t < 0).any()):"
    results = {"modules": {"reference_impl/m.py": {"state": "partial", "mutants": [
        {"id": "m.py:82:0", "line_number": 82, "line": line, "index": 0, "status": "untested"},
        {"id": "m.py:24:0", "line_number": 24, "line": line, "index": 0, "status": "killed"}]}}}
    entry = {"id": "m.py:82:0", "line": line, "status": "killed", "test": "t.py::test_x"}
    seen = render.summarise(results, [entry], {"m.py:82:0": {"killed": True, "line": line, "test": "t.py::test_x"}})
    (row,) = seen["rows"]
    assert (row["killed"], row["untested"], row["state"], row["score"]) == (2, 0, "complete", 1.0)
    for checks in ({}, {"m.py:82:0": {"killed": True, "line": line, "test": "old_file.py::test_x"}}):
        # unconfirmed, or confirmed for a test the claim no longer names (it moved, or was replaced)
        (row,) = render.summarise(results, [entry], checks)["rows"]
        assert (row["killed"], row["untested"], row["state"]) == (1, 1, "partial")


def _claims() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    text = (REPO / "tools" / "mutation" / "classification.yaml").read_text()
    return [e for e in yaml.safe_load(text)["mutants"] if e["status"] == "killed"]


def test_every_kill_claim_names_a_test_that_exists():
    """The mutation page names, for each survivor a new test kills, that test: a test since moved or renamed
    leaves the page pointing at nothing, and --verify-kills could no longer run it."""
    missing = []
    for e in _claims():
        path, _, name = e["test"].partition("::")
        source = REPO / path
        function = name.split("[")[0].rsplit("::", 1)[-1]
        if not source.is_file() or (function and f"def {function}(" not in source.read_text()):
            missing.append(f"{e['id']}: {e['test']}")
    assert not missing, "kill claims naming no test:\n" + "\n".join(missing)


def test_every_kill_check_is_of_a_claim_as_it_stands():
    """verified.json holds --verify-kills' check of each claim: one per claim, made with the test the claim
    names now, on the line it names, and each a kill (a check of a test since moved proves nothing)."""
    checks = json.loads((REPO / "tools" / "mutation" / "verified.json").read_text())
    claims = {e["id"]: e for e in _claims()}
    assert sorted(checks) == sorted(claims)
    stale = [k for k, c in checks.items()
             if (c["test"], c["line"], c["killed"]) != (claims[k]["test"], claims[k]["line"].strip(), True)]
    assert not stale, f"checks to redo with run.py --verify-kills: {stale}"


def test_a_claims_line_is_found_in_its_module_without_mutmuts_cache():
    """--verify-kills rebuilds a mutant from the module when no cache holds it: the claim's line text, at the
    occurrence nearest the line number it was recorded at (lines above it may have moved since)."""
    locate = _tool("run").locate_line
    source = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n"
    assert locate(source, "return x + 1", 5) == {"raw_line": "    return x + 1", "line_number": 6}
    assert locate(source, "return x + 1", 1)["line_number"] == 2
    assert locate(source, "return x - 1", 2) is None
