"""Meta-tests: an adapter that misbehaves outside its operations never passes, and never crashes the audit.

Each case is an implementation module or factory that once ended an audit with the wrong exit code: a
``sys.exit()`` while importing or building (exit 0, no report), a property that raises (an internal error), a
misspelt op in ``capabilities['differentiable']`` (silently accepted); and the audit's own surroundings: an
``--out`` it cannot write, a ``--budget`` that runs out (reported as a Ctrl-C), a ``types.py`` in the caller's
directory (the audit's child died starting up), a failed pre-flight under ``pytest --impl`` (blamed on
whichever test module was collected first).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from rlconform import cli, launch
from rlconform.audit import clause_report, run_suite

import reference_impl
from conformance_tests.impl import override
from conformance_tests.preflight import PreflightError, check_capabilities

pytestmark = pytest.mark.meta
HERE = "conformance_tests.meta.test_hostile_adapters"
ROOT = Path(__file__).resolve().parents[2]


def _cli(*argv):
    """(exit code, stdout, stderr) of ``rlconform`` run in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


# ----------------------------------------------------------------------------- hostile implementations
def exit_0_factory():
    sys.exit(0)


def exit_1_factory():
    sys.exit(1)


def raising_factory():
    raise RuntimeError("mylib: the config file is missing")


class _LazyFamily:
    """A library that imports its backend when the family is first read, and fails there."""
    name, version = "lazy", "1"

    @property
    def ppo(self):
        raise RuntimeError("mylib: lazy import of the ppo backend failed")


class _LazyCapabilities:
    name, version = "lazy-caps", "1"
    ppo = reference_impl.make().ppo

    @property
    def capabilities(self):
        raise KeyError("mylib: capabilities read from a missing config")


class _LazyOps:
    @property
    def ratio(self):
        raise ImportError("mylib: the ratio kernel failed to load")


def lazy_family():
    return _LazyFamily()


def lazy_capabilities():
    return _LazyCapabilities()


def lazy_op():
    return types.SimpleNamespace(name="lazy-op", version="1", ppo=_LazyOps())


def stalling_ratio_impl():
    def ratio(new_log_prob, old_log_prob):
        time.sleep(1000)

    return override(reference_impl.make(), "ppo", ratio=ratio)


# ----------------------------------------------------------------------------- exit 3 at pre-flight
@pytest.mark.parametrize("factory, said", [
    ("exit_0_factory", "the factory raised SystemExit(0)"),
    ("exit_1_factory", "the factory raised SystemExit(1)"),
    ("lazy_family", "reading impl.ppo raised RuntimeError"),
    ("lazy_capabilities", "reading impl.capabilities raised KeyError"),
    ("lazy_op", "reading impl.ppo.ratio raised ImportError"),
])
def test_an_exit_or_a_raising_attribute_in_the_adapter_is_exit_3_naming_it(tmp_path, factory, said):
    """sys.exit(0) in the factory once ended the audit with exit 0 (a pass) and no report; a property that
    raises, with an internal error (exit 4)."""
    try:
        code, out, err = _cli("audit", "--impl", f"{HERE}:{factory}", "--clause", "PPO-RATIO-1", "--out", tmp_path)
    except SystemExit as e:  # the audit's own process ended by the implementation
        pytest.fail(f"the audit exited {e.code!r} with the implementation's sys.exit()")
    assert code == 3, (out, err[-2000:])
    assert "the implementation cannot be run" in err and said in err, err[-2000:]
    assert "internal error" not in err and not (tmp_path / "report.json").exists()


@pytest.mark.parametrize("code", [0, 1])
def test_a_module_that_exits_while_imported_is_exit_3(tmp_path, monkeypatch, code):
    name = f"hostile_exit_{code}_on_import"
    (tmp_path / f"{name}.py").write_text(f"import sys\nsys.exit({code})\n\ndef make():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # and sys.path restored after the audit adds to it
    monkeypatch.chdir(tmp_path)
    try:
        got, out, err = _cli("audit", "--impl", f"{name}:make", "--clause", "PPO-RATIO-1", "--out", tmp_path / "o")
    except SystemExit as e:
        pytest.fail(f"the audit exited {e.code!r} with the implementation's sys.exit()")
    assert got == 3 and f"importing {name!r} raised SystemExit({code})" in err, err[-2000:]


@pytest.mark.parametrize("caps, said", [
    ({"differentiable": ["ppo.clipped_policy_los"]},
     "names 'ppo.clipped_policy_los', not a contract op (\"family.op\", e.g. \"ppo.value_loss\"); "
     "did you mean 'ppo.clipped_policy_loss'?"),
    ({"differentiable": ["clipped_policy_loss"]}, "names 'clipped_policy_loss', not a contract op"),
    ({"differentiable": "ppo.value_loss"}, "capabilities['differentiable'] must be True, False or a list"),
    ({"differentiable": None}, "capabilities['differentiable'] must be True, False or a list"),
    ({"masks": "no"}, "capabilities['masks'] must be True or False, got 'no'"),
    ({"terminated_truncated": 1}, "capabilities['terminated_truncated'] must be True or False, got 1"),
    ({"errors_name_clauses": "yes"}, "capabilities['errors_name_clauses'] must be True or False"),
])
def test_a_misspelt_or_mistyped_capability_stops_the_preflight(caps, said):
    """A misspelt op in ``differentiable`` declared that op's outputs without a gradient, so a detached loss
    passed; a string for a flag read as True."""
    with pytest.raises(PreflightError) as e:
        check_capabilities(caps, "m:f")
    assert said in str(e.value)


@pytest.mark.parametrize("caps", [
    {"differentiable": ["ppo.clipped_policy_loss", "sac.losses"]}, {"differentiable": []},
    {"differentiable": False}, {"masks": False, "terminated_truncated": True, "errors_name_clauses": False},
])
def test_well_formed_capabilities_pass_the_preflight(caps):
    check_capabilities(caps, "m:f")


def misspelt_differentiable():
    """A loss that carries no gradient, declared under a misspelt op name."""
    ref = reference_impl.make()
    impl = override(ref, "ppo", clipped_policy_loss=lambda ratio, advantage, *, clip_eps:
                    ref.ppo.clipped_policy_loss(ratio, advantage, clip_eps=clip_eps).detach())
    impl.capabilities = {**impl.capabilities, "differentiable": ["ppo.clipped_policy_los"]}
    return impl


def test_a_misspelt_differentiable_op_is_exit_3_not_a_pass(tmp_path):
    code, _, err = _cli("audit", "--impl", f"{HERE}:misspelt_differentiable", "--clause", "PPO-LOSS-1",
                        "--out", tmp_path)
    assert code == 3 and "did you mean 'ppo.clipped_policy_loss'?" in err, err[-2000:]


# ----------------------------------------------------------------------------- pytest --impl
@pytest.mark.parametrize("factory, said", [
    ("raising_factory", "mylib: the config file is missing"),
    ("exit_0_factory", "the factory raised SystemExit(0)"),
    ("lazy_family", "mylib: lazy import of the ppo backend failed"),
])
def test_pytest_impl_that_cannot_run_is_one_error_naming_the_impl_never_a_test_module(tmp_path, factory, said):
    """It was reported as "ERROR collecting <the first test module>" (a meta-test's, once), and a
    raising property as an INTERNALERROR."""
    proc = launch.run([sys.executable, "-m", "pytest", "--pyargs", "conformance_tests.test_ppo_losses",
                       "conformance_tests.test_sac_backup", "-p", "no:cacheprovider", "-q",
                       "--impl", f"{HERE}:{factory}"], cwd=ROOT, timeout=300, tmp=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 5), text[-3000:]
    assert "rlconform pre-flight: the implementation cannot be run" in text and said in text, text[-3000:]
    assert f"--impl '{HERE}:{factory}'" in text
    assert "ERROR collecting" not in text and "INTERNALERROR" not in text, text[-3000:]
    assert "test_ppo_losses" not in text and "test_sac_backup" not in text, text[-3000:]


# ----------------------------------------------------------------------------- the audit's surroundings
def _unwritable(path: str) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=path)
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


@pytest.mark.parametrize("out", ["/sys/kernel", "/proc"])
def test_an_out_directory_that_cannot_be_written_is_a_usage_error(out):
    """Root passes os.access on any directory: writing there failed only at the end, as an internal error."""
    if not os.path.isdir(out) or not _unwritable(out):
        pytest.skip(f"{out} is writable (or absent) here")
    code, _, err = _cli("audit", "--clause", "PPO-RATIO-1", "--out", out)
    assert code == 2 and f"--out {out}: the directory is not writable" in err, err[-2000:]


def test_a_budget_that_runs_out_says_so_and_is_not_an_interruption():
    payload = run_suite(f"{HERE}:stalling_ratio_impl", clauses=["PPO-RATIO-1", "PPO-LOSS-1"], timeout=60, budget=4)
    report = clause_report(payload)
    info, summary = report["run_info"], report["summary"]
    assert info["budget_exhausted"] and not info["interrupted"], info
    assert summary["exit_code"] == 4 and "time budget (--budget) ran out" in summary["verdict"], summary
    assert "interrupted" not in summary["verdict"]


def _project_with_a_types_module(tmp_path: Path, name: str) -> Path:
    """A directory holding the adapter and a harmless ``types.py``, which shadows the standard library's
    for any interpreter that puts the directory before it while starting."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "types.py").write_text("X = 1\n")
    (proj / f"{name}.py").write_text("import reference_impl\n\n\ndef make():\n    return reference_impl.make()\n")
    return proj


def test_a_stdlib_named_file_in_the_callers_directory_leaves_the_audit_alone(tmp_path):
    """The caller's directory reached the audit's child first on PYTHONPATH: the child died starting up
    ("Fatal Python error: init_import_site", exit 4) where ``python -m pytest --impl`` works."""
    proj = _project_with_a_types_module(tmp_path, "hostile_cwd_adapter")
    script = Path(sys.executable).parent / "rlconform"  # a fresh audit child, as a user runs it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(script), "audit", "--impl", "hostile_cwd_adapter:make", "--clause", "PPO-RATIO-1",
                           "--out", "o"], cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((proj / "o" / "report.json").read_text())["clauses"][0]["status"] == "pass"


def test_the_callers_directory_reaches_an_audit_child_forked_from_the_warm_server(tmp_path, monkeypatch):
    """The meta-tests' audits fork their child from a server started before the caller's directory was known."""
    proj = _project_with_a_types_module(tmp_path, "hostile_forked_adapter")
    monkeypatch.chdir(proj)
    payload = run_suite("hostile_forked_adapter:make", clauses=["PPO-RATIO-1"])
    assert payload["preflight_error"] is None, payload["preflight_error"]
    assert clause_report(payload)["clauses"][0]["status"] == "pass"
