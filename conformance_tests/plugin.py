"""The rlconform pytest plugin (registered through the ``pytest11`` entry point).

Options: ``--impl module:factory`` (or ``RLCONFORM_IMPL``), ``--device``, ``--profile ci|release``,
``--clauses ID,ID`` (run only the tests of those clauses), ``--expectations FILE`` (declared known
failures) and ``--rlconform-report FILE`` (per-test results as JSON, which ``rlconform audit`` turns
into the clause report).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, settings

from conformance_tests import harness
from conformance_tests.impl import ImplSpecError, load_impl, resolve_impl_string
from rlconform.spec import SpecError, default_spec

settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "release",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Killing a mutant needs one failing example, not the minimal one: skip shrinking.
settings.register_profile("mutant", parent=settings.get_profile("ci"),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])

_RESULTS_KEY = pytest.StashKey[dict]()
_PREV_KEY = pytest.StashKey[tuple]()


def pytest_unconfigure(config):
    if _PREV_KEY in config.stash:
        harness.configure(*config.stash[_PREV_KEY])


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


def pytest_addoption(parser):
    g = parser.getgroup("rlconform")
    g.addoption("--impl", default=None, help="implementation factory 'module:factory' (default: the bundled reference)")
    g.addoption("--device", default=os.environ.get("RLCONFORM_DEVICE", "cpu"), help="torch device for test tensors")
    g.addoption(
        "--profile",
        default=os.environ.get("RLCONFORM_PROFILE", "ci"),
        choices=("ci", "release", "mutant"),
        help="hypothesis profile: ci (derandomised, fast), release (more examples), mutant (ci without shrinking)",
    )
    g.addoption("--clauses", default=None, help="comma-separated clause ids: run only their tests")
    g.addoption("--families", default=None, help="comma-separated families: run only their clauses' tests")
    g.addoption("--expectations", default=None, help="YAML list of known failures: {clause, reason, link}")
    g.addoption("--rlconform-skip-id-check", action="store_true", help=argparse_hidden())
    g.addoption("--rlconform-report", default=None, help="write per-test results as JSON here")


def pytest_configure(config):
    import torch

    if os.environ.get("RLCONFORM_THREADS") is None:
        torch.set_num_threads(1)  # the suite's tensors are tiny: intra-op threads only add synchronisation
    config.addinivalue_line("markers", "clause(*ids): the spec clause(s) this test checks")
    config.addinivalue_line("markers", "meta: tests of the suite itself (not run by audits)")
    settings.load_profile(config.getoption("--profile"))
    impl_str = resolve_impl_string(config.getoption("--impl"))
    config.stash[_PREV_KEY] = harness.configure(impl_str, config.getoption("--device"))
    config.stash[_RESULTS_KEY] = {"tests": {}, "started": time.time(), "impl": impl_str}


@pytest.fixture(scope="session")
def impl(pytestconfig):
    """The implementation under test (built once per session)."""
    try:
        return load_impl(pytestconfig.getoption("--impl"))
    except ImplSpecError as e:
        raise pytest.UsageError(str(e)) from e


@pytest.fixture(scope="session")
def device(pytestconfig):
    import torch

    return torch.device(pytestconfig.getoption("--device"))


def _family_fixture(name):
    @pytest.fixture(name=name, scope="session")
    def fixture(impl):
        return harness.FamilyProxy(name, getattr(impl, name, None))

    fixture.__doc__ = f"The {name} operations of the implementation under test, behind the recording proxy."
    return fixture


sac = _family_fixture("sac")
ppo = _family_fixture("ppo")
isreshape = _family_fixture("isreshape")
ccapo = _family_fixture("ccapo")


def pytest_runtest_setup(item):
    harness.reset_calls()


def _load_expectations(path):
    if not path:
        return {}
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []
    if isinstance(raw, dict):
        raw = raw.get("expected_failures", [])
    out = {}
    for entry in raw:
        if not isinstance(entry, dict) or "clause" not in entry or "reason" not in entry:
            raise pytest.UsageError(f"{path}: each expectation needs 'clause' and 'reason' (and may give 'link')")
        out[entry["clause"]] = entry
    return out


DOCS_MODULES = ("mkdocs", "material", "pymdownx", "mathjax")


def _docs_toolchain_missing() -> list[str]:
    import importlib.util

    return [m for m in DOCS_MODULES if importlib.util.find_spec(m) is None]


def pytest_ignore_collect(collection_path, config):
    """The site tests need the docs extra: collected when it is installed, or always with
    RLCONFORM_SITE_TESTS=1 (CI), where a missing toolchain then fails loudly."""
    if collection_path.name == "test_site.py" and os.environ.get("RLCONFORM_SITE_TESTS") != "1":
        if _docs_toolchain_missing():
            config.stash[_SITE_SKIPPED] = True
            return True
    return None


_SITE_SKIPPED = pytest.StashKey[bool]()


def item_clauses(item) -> tuple[str, ...]:
    ids = []
    for m in item.iter_markers("clause"):
        ids.extend(m.args)
    return tuple(dict.fromkeys(ids))


def pytest_collection_modifyitems(session, config, items):
    spec = default_spec()
    unknown = sorted({c for it in items for c in item_clauses(it) if c not in spec.clauses})
    if unknown and not config.getoption("--rlconform-skip-id-check"):
        raise pytest.UsageError(f"tests name clause id(s) absent from spec/: {', '.join(unknown)}")
    wanted = config.getoption("--clauses")
    if wanted:
        want = {c.strip() for c in wanted.split(",") if c.strip()}
        bad = sorted(want - set(spec.clauses))
        if bad:
            raise pytest.UsageError(f"--clauses names unknown clause id(s): {', '.join(bad)}")
        keep = [it for it in items if want & set(item_clauses(it))]
        drop = [it for it in items if it not in keep]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
    fams = config.getoption("--families")
    if fams:
        want_f = {f.strip() for f in fams.split(",") if f.strip()}
        keep = [it for it in items if any(spec.clause(c).family in want_f for c in item_clauses(it))]
        drop = [it for it in items if it not in keep]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
    expectations = _load_expectations(config.getoption("--expectations"))
    store = config.stash[_RESULTS_KEY]
    store["expectations"] = expectations
    matched = set()
    for it in items:
        cl = item_clauses(it)
        hit = [c for c in cl if c in expectations]
        if hit:
            matched.update(hit)
            reason = "; ".join(f"{c}: {expectations[c]['reason']}" for c in hit)
            it.add_marker(pytest.mark.xfail(reason=f"expected failure ({reason})", strict=False))
        store["tests"][it.nodeid] = {"clauses": list(cl), "outcome": None, "message": None, "meta": bool(list(it.iter_markers("meta")))}
    store["unmatched_expectations"] = sorted(set(expectations) - matched)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.excinfo is not None and call.when == "call":
        if call.excinfo.errisinstance(harness.ImplementationError):
            rep.user_properties.append(("rlconform_status", "error"))
        snippet = harness.repro_snippet()
        if snippet and rep.failed:
            rep.sections.append(("rlconform repro", snippet))
            rep.user_properties.append(("rlconform_repro", snippet))


def _classify(rep) -> str:
    props = dict(rep.user_properties)
    if hasattr(rep, "wasxfail"):
        return "expected_fail" if rep.skipped else "xpass"
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        return "not_applicable" if harness.NOT_APPLICABLE in reason else "skipped"
    if rep.failed:
        if rep.when != "call" or props.get("rlconform_status") == "error":
            return "error"
        return "fail"
    return "pass"


def pytest_runtest_logreport(report):
    if not _SESSIONS:
        return
    config = _SESSIONS[-1]
    store = config.stash[_RESULTS_KEY]
    entry = store["tests"].get(report.nodeid)
    if entry is None:
        return
    if report.when == "call" or report.failed or report.skipped:
        status = _classify(report)
        # a teardown error after a passing call still counts; the first non-pass wins
        if entry["outcome"] in (None, "pass") or status != "pass":
            entry["outcome"] = status
        if status in ("fail", "error", "expected_fail", "not_applicable", "skipped"):
            text = report.longreprtext if hasattr(report, "longreprtext") else str(report.longrepr)
            entry["message"] = text[-4000:]
            props = dict(report.user_properties)
            if "rlconform_repro" in props:
                entry["repro"] = props["rlconform_repro"]


# A stack, because the suite's own meta-tests run pytest sessions inside a session.
_SESSIONS: list = []


def pytest_sessionstart(session):
    _SESSIONS.append(session.config)
    try:
        default_spec()
    except SpecError as e:
        raise pytest.UsageError(f"spec/ is invalid: {e}") from e


def pytest_report_header(config):
    spec = default_spec()
    impl_str = resolve_impl_string(config.getoption("--impl"))
    versions = ", ".join(f"{k} {v}" for k, v in spec.versions().items())
    try:
        obj = load_impl(impl_str)
        named = f"{getattr(obj, 'name', '?')} {getattr(obj, 'version', '?')}"
    except ImplSpecError as e:
        named = f"unloadable ({e})"
    return [
        f"rlconform: impl={impl_str} ({named}) device={config.getoption('--device')} profile={config.getoption('--profile')}",
        f"rlconform: spec {versions}",
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    store = config.stash.get(_RESULTS_KEY, None)
    if not store:
        return
    for clause in store.get("unmatched_expectations", []):
        terminalreporter.write_line(
            f"rlconform: warning: expectation for {clause} matches no collected test", yellow=True
        )
    if config.stash.get(_SITE_SKIPPED, False):
        terminalreporter.write_line("rlconform: docs site tests not collected (pip install -e '.[docs]' to run them)")
    na = sum(1 for t in store["tests"].values() if t["outcome"] == "not_applicable")
    if na:
        terminalreporter.write_line(f"rlconform: {na} test(s) not applicable (operations the implementation does not provide)")


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    path = config.getoption("--rlconform-report")
    store = config.stash.get(_RESULTS_KEY, None)
    if _SESSIONS and _SESSIONS[-1] is config:
        _SESSIONS.pop()
    if not path or store is None:
        return
    impl_obj = None
    try:
        impl_obj = load_impl(store["impl"])
    except Exception:  # noqa: BLE001 - the report is still written whole
        pass
    payload = {
        "impl": store["impl"],
        "impl_name": getattr(impl_obj, "name", None),
        "impl_version": getattr(impl_obj, "version", None),
        "profile": config.getoption("--profile"),
        "device": config.getoption("--device"),
        "seed": "derandomized" if config.getoption("--profile") == "ci" else "random",
        "started": store["started"],
        "finished": time.time(),
        "exitstatus": int(exitstatus),
        "tests": store["tests"],
        "expectations": store.get("expectations", {}),
        "unmatched_expectations": store.get("unmatched_expectations", []),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)
