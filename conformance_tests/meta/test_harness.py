"""Meta-tests of the harness: not-applicable, errors, expected failures, messages, repros, the audit CLI."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from rlconform import audit, cli, launch
from rlconform.audit import clause_report, render_checklist, run_suite
from rlconform.coverage import collect_tests
from rlconform.spec import default_spec

import reference_impl
from conformance_tests.harness import _REPRO_HELPERS, _literal
from conformance_tests.impl import ImplSpecError, load_impl, override, without
from conformance_tests.layout import clause_test_files
from conformance_tests.meta.run_once import once_per_run
from conformance_tests.modules import TableModule
from conformance_tests.runtime import _profiles

pytestmark = pytest.mark.meta
SAC_TOPP = ["SAC-TOPP-1", "SAC-TOPP-3", "SAC-V-1"]


def partial_impl():
    """The reference without Top-p: its clauses must be not applicable, not failed."""
    return without(reference_impl.make(), "sac", "top_p_select", "top_p_soft_value")


def raising_impl():
    """The reference whose soft value raises: its clause is an error, and the run goes on."""
    def soft_value(*a, **k):
        raise RuntimeError("boom")

    return override(reference_impl.make(), "sac", soft_value=soft_value)


def declared_conventions_impl():
    """The reference with two ops that follow declared conventions, which every test must honour: one
    target entropy for every state, and advantages standardised with the population std and eps 1e-6."""
    def target_entropy(legal_mask, *, kappa=0.9):
        return torch.full(legal_mask.shape[:-1], kappa * math.log(legal_mask.shape[-1]), dtype=torch.float64)

    def normalize_advantages(advantage, *, eps=1e-6, clamp=None):
        out = (advantage - advantage.mean()) / (advantage.std(correction=0) + eps)
        return out if clamp is None else out.clamp(-clamp, clamp)

    impl = override(override(reference_impl.make(), "sac", target_entropy=target_entropy), "ppo",
                    normalize_advantages=normalize_advantages)
    impl.capabilities["conventions"] = {"target_entropy": "scalar",
                                        "advantage_std": {"ddof": 0, "eps": 1e-6, "eps_mode": "add"}}
    return impl


def _report(impl, clauses, **kw):
    """The clause report of an audit; the mutant profile (no shrinking) where only statuses are checked."""
    return clause_report(run_suite(impl, clauses=clauses, **kw))


def _status(report):
    return {c["id"]: c["status"] for c in report["clauses"]}


def test_missing_operations_are_not_applicable():
    st = _status(_report("conformance_tests.meta.test_harness:partial_impl", SAC_TOPP, profile="mutant"))
    assert st["SAC-TOPP-1"] == "not_applicable"
    assert st["SAC-TOPP-3"] == "not_applicable"
    assert st["SAC-V-1"] == "pass"


def test_an_operation_that_raises_is_an_error_and_the_report_is_whole():
    rep = _report("conformance_tests.meta.test_harness:raising_impl", SAC_TOPP, profile="mutant")
    st = _status(rep)
    assert st["SAC-V-1"] == "error"
    assert st["SAC-TOPP-1"] == "pass"
    assert rep["summary"]["must_failed"] == ["SAC-V-1"]


def test_failure_message_names_clause_and_call_and_repro_runs():
    rep = _report("conformance_tests.mutants.sac:no_done_truncation", ["SAC-TD-1"], profile="mutant")
    entry = next(c for c in rep["clauses"] if c["id"] == "SAC-TD-1")
    assert entry["status"] == "fail"
    assert "but should be" in entry["message"] and "[SAC-TD-1: sac.td_target(" in entry["message"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(entry["repro"], "repro", "exec"), {})  # the snippet replays the failing call
    assert "tensor(" in out.getvalue()


def test_expectations_turn_known_failures_into_expected_failures(tmp_path):
    exp = tmp_path / "expect.yaml"
    exp.write_text("- {clause: SAC-TEMP-1, reason: V1 sign kept on purpose, link: 'https://example.invalid/1'}\n"
                   "- {clause: SAC-TEMP-2, reason: same}\n- {clause: SAC-CQL-1, reason: matches nothing here}\n"
                   "- {clause: SAC-TD-1, reason: fixed since}\n")
    rep = _report("conformance_tests.mutants.sac:v1_temperature_sign", ["SAC-TEMP-1", "SAC-TEMP-2", "SAC-TD-1"],
                  expectations=str(exp), profile="mutant")
    st = _status(rep)
    assert st["SAC-TEMP-1"] == "expected_fail" and st["SAC-TEMP-2"] == "expected_fail"
    temp1 = next(c for c in rep["clauses"] if c["id"] == "SAC-TEMP-1")
    assert temp1["expectation"]["reason"] == "V1 sign kept on purpose"
    assert rep["summary"]["must_failed"] == []
    assert any("SAC-CQL-1" in w for w in rep["warnings"])
    # an expectation for a clause that passes hides nothing now, and would hide the next regression
    assert st["SAC-TD-1"] == "pass"
    assert any("SAC-TD-1" in w and "stale" in w for w in rep["warnings"])
    assert not any("SAC-TEMP-1" in w for w in rep["warnings"])
    assert "warning" in render_checklist(rep)


def test_load_impl_explains_bad_strings():
    for bad, msg in (("nocolon", "module:factory"), ("no_such_module_xyz:make", "no module named"),
                     ("reference_impl:nope", "no attribute"), ("reference_impl:__version__", "not a callable factory")):
        with pytest.raises(ImplSpecError, match=msg):
            load_impl(bad)


def test_audit_cli_writes_report_and_exits_by_must_failures(tmp_path):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = cli.main(["audit", "--impl", "conformance_tests.mutants.sac:no_done_truncation", "--family", "sac",
                         "--clause", "SAC-TD-1", "--clause", "SAC-TEMP-1", "--out", str(tmp_path)])
    assert code == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert {c["id"] for c in report["clauses"]} == {"SAC-TD-1", "SAC-TEMP-1"}  # only the clauses asked for
    assert {"implementation", "profile", "seed", "device", "started", "finished", "spec_versions"} <= set(report["run_info"])
    td = next(c for c in report["clauses"] if c["id"] == "SAC-TD-1")
    assert td["status"] == "fail" and td["level"] == "MUST" and td["tests"] >= 2
    text = out.getvalue()
    assert text.index("Verdict (exit 1)") < text.index("## Findings that fail the audit") < text.index("Grey-release checklist") \
        < text.index("Summary")
    assert "(1-done) truncation" in text
    assert (tmp_path / "checklist.md").read_text().startswith("# rlconform audit")


@pytest.mark.parametrize("argv, why", [
    (["--clause", "SAC-TD-9"], "--clause SAC-TD-9: no such clause"),
    (["--clause", "SAC-TD-1", "--family", "ppo"], "--clause SAC-TD-1 is a sac clause, outside --family ppo"),
    (["--clause", "SAC-GATE-1"], "--clause SAC-GATE-1 is outside every audit"),  # a gate: judged on runs
    (["--clause", "CCAPO-STDB-6"], "--clause CCAPO-STDB-6 is outside every audit"),  # the reference's store
])
def test_audit_cli_rejects_a_clause_it_cannot_audit(tmp_path, capsys, argv, why):
    assert cli.main(["audit", *argv, "--out", str(tmp_path)]) == 2
    assert why in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()


def test_reference_soft_value_runs_on_the_default_device():
    # the contract is device-agnostic: outputs live where the inputs live
    p = torch.full((1, 2), 0.5, dtype=torch.float64)
    ref = reference_impl.make()
    v = ref.sac.soft_value(p, p, p, torch.ones(1, 2, dtype=torch.bool), alpha=0.1)
    assert v.device == p.device


def test_the_clauses_outside_audits_are_exactly_those_no_clause_test_checks():
    """``audited: false`` in the spec is what the audit leaves out of its verdict: it must name every clause
    that only meta-tests check (else an audit reports it untested) and no clause a clause test checks (else
    an audit silently drops a verdict)."""

    marks, code, output, _ = collect_tests()
    assert code == 0, output[-3000:]
    by_clause_tests = {c for nodeid, cls in marks.items() if "/meta/" not in "/" + nodeid.split("::")[0] for c in cls}
    checked = {c for cls in marks.values() for c in cls}
    outside = {c for c, clause in default_spec().clauses.items() if not clause.audited}
    assert outside == checked - by_clause_tests


def test_a_family_runs_its_own_test_files_and_the_shared_ones():

    ppo = [f.name for f in clause_test_files(["ppo"])]
    assert ppo and all(n.startswith("test_ppo_") or not n.startswith(("test_sac_", "test_isreshape_", "test_ccapo_"))
                       for n in ppo), ppo
    assert "test_defaults.py" in ppo
    every = {f.name for f in clause_test_files()}
    assert set(ppo) < every and not any(f.parent.name == "meta" for f in clause_test_files())
    with pytest.raises(ValueError, match="unknown families"):
        clause_test_files(["dqn"])


def test_no_code_names_an_issue_or_the_history_of_its_work():
    """Code says what it does and why; which issue asked for it belongs to the tracker and the commit log."""
    root = Path(__file__).resolve().parents[2]
    history = re.compile(r"\bissue\s*#?\d+|\bmutation_gaps\b", re.IGNORECASE)
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()[:80]}"
            for top in ("conformance_tests", "reference_impl", "tools", "spec")
            for p in sorted((root / top).rglob("*")) if p.suffix in (".py", ".yaml", ".toml", ".sh")
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if history.search(line)]
    assert not hits, "\n".join(hits)


def test_the_files_chosen_for_a_clause_hold_every_test_of_it():
    """An audit of some clauses runs only the modules :func:`clause_test_files` picks for them: each clause's
    tests, as a collection finds them, must all lie in those modules (a module whose marks are computed
    rather than literal would otherwise drop tests silently)."""
    marks, code, output, _ = collect_tests()
    assert code == 0, output[-3000:]
    spec = default_spec()
    files_of: dict[str, set[str]] = {}
    for nodeid, cls in marks.items():
        path = nodeid.split("::")[0]
        if "/meta/" not in "/" + path:
            for c in cls:
                files_of.setdefault(c, set()).add(path.rsplit("/", 1)[-1])
    for clause, files in sorted(files_of.items()):
        chosen = {f.name for f in clause_test_files([spec.clause(clause).family], [clause])}
        assert files <= chosen, f"{clause}: tests in {sorted(files - chosen)} are not among the chosen {sorted(chosen)}"


def test_a_run_once_value_is_built_once_and_a_failed_build_is_not_kept(tmp_path_factory):

    calls = []

    def build(d):
        calls.append(d)
        (d / "made").write_text("x")
        return {"dir": d, "n": len(calls)}

    first = once_per_run(tmp_path_factory, "meta-probe", build)
    assert once_per_run(tmp_path_factory, "meta-probe", build) == first and len(calls) == 1
    assert (first["dir"] / "made").read_text() == "x"

    def broken(d):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        once_per_run(tmp_path_factory, "meta-broken", broken)
    assert once_per_run(tmp_path_factory, "meta-broken", build)["n"] == 2  # the next caller builds again


def test_the_mutant_profile_stops_a_clause_at_its_first_failure():
    """Killing a mutant needs one failing test per clause: after it, the clause's other tests are skipped,
    and the clause is still reported failed."""
    payload = run_suite("conformance_tests.mutants.sac:no_done_truncation", clauses=["SAC-TD-1"], profile="mutant")
    outcomes = sorted(t["outcome"] for t in payload["tests"].values() if t["clauses"] == ["SAC-TD-1"])
    assert outcomes.count("fail") == 1 and outcomes.count("skipped") >= 1, outcomes
    assert _status(clause_report(payload))["SAC-TD-1"] == "fail"


def test_a_mutant_run_orders_fixed_inputs_first_and_stops_on_the_requested_clauses():
    """Fixed-input tests run before property tests; once every clause the run was asked about has failed,
    a later test is skipped even if it also checks another clause (which nobody asked about)."""
    payload = run_suite("conformance_tests.mutants.ppo:old_log_prob_not_detached", clauses=["PPO-OLD-1"],
                        profile="mutant")
    tests = list(payload["tests"].values())  # in the order they ran
    kinds = [t["kind"] for t in tests]
    assert kinds == sorted(kinds, key=["golden", "example", "property"].index), kinds
    first = next(i for i, t in enumerate(tests) if t["outcome"] == "fail")
    later = tests[first + 1:]
    assert later and all(t["outcome"] == "skipped" for t in later), tests
    assert any(set(t["clauses"]) - {"PPO-OLD-1"} for t in later), "no later test checks another clause too"
    # those other clauses ran only in part: the report gives them no verdict (never a "not applicable")
    assert _status(clause_report(payload)) == {"PPO-OLD-1": "fail"}


def test_failures_tried_while_a_test_runs_are_formatted_by_the_stdlib(request):
    """Hypothesis formats every failing example it tries (shrinking included) through ``repr_failure``;
    while a test runs that is the stdlib's formatter, as pytest's re-parses source files each time."""
    try:
        raise ValueError("boom")
    except ValueError:
        info = pytest.ExceptionInfo.from_current()
    text = request.node.repr_failure(info)
    assert isinstance(text, str) and text.startswith("Traceback") and "ValueError: boom" in text


def test_only_the_release_profile_explains_a_failure():
    """Also when the profiles are registered again while one of them is loaded (a second session in this
    process): release is then still random and explains, not a copy of ci."""
    from hypothesis import Phase, settings

    previous = settings._current_profile
    settings.load_profile("rlconform-ci")
    try:
        _profiles()
    finally:
        settings.load_profile(previous)
    ci, release = settings.get_profile("rlconform-ci"), settings.get_profile("rlconform-release")
    assert Phase.explain not in ci.phases and Phase.shrink in ci.phases and ci.derandomize
    assert Phase.explain in release.phases and not release.derandomize and release.max_examples == 300
    smoke = settings.get_profile("rlconform-smoke")  # ci with fewer examples, never another kind of run
    assert smoke.max_examples == 5 and smoke.derandomize and smoke.phases == ci.phases


_NEW_MODULES = """
import json, sys
before = set(sys.modules)
import pytest
pytest.main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(sorted(set(sys.modules) - before), f)
"""


@pytest.mark.parametrize("family", ["sac", "ppo", "isreshape", "ccapo"])
def test_a_warm_audit_child_imports_next_to_nothing_the_server_did_not_preload(family, tmp_path):
    """What an audit child imports itself is paid by every one of the meta-tests' and mutants' audits.
    Collecting a family there may import its test modules, conftest, pytest's lazily loaded plugins and
    stdlib modules, and hardly anything else: a test module that starts importing a new heavy package
    (scipy.optimize was one: 260 modules, 0.16 s per child) belongs in the server's list."""
    import sys

    (tmp_path / "pytest.ini").write_text(audit._INI, encoding="utf-8")
    (tmp_path / "skip.txt").write_text("", encoding="utf-8")
    (tmp_path / "new_modules_probe.py").write_text(_NEW_MODULES, encoding="utf-8")
    files = [str(f) for f in clause_test_files([family])]
    args = audit._child_args(tmp_path, files, impl="reference_impl:make", profile="ci", device="cpu",
                             clauses=None, families=[family], expectations=None, jobs=None, timeout=None,
                             seed=None, events=tmp_path / "events.jsonl", skip=tmp_path / "skip.txt",
                             extra=["--collect-only"])
    out = tmp_path / "new_modules.json"
    with launch.warm():
        child = launch.start([sys.executable, "-m", "new_modules_probe", str(out), *args[3:]], cwd=tmp_path,
                             env=audit.child_env(), stdout=tmp_path / "log")
        assert isinstance(child, launch.Forked), "the child was not forked from the warm forkserver"
        assert child.wait(120) == 0, (tmp_path / "log").read_text()[-3000:]
    new = json.loads(out.read_text())
    assert any(m.rsplit(".", 1)[-1].startswith("test_") for m in new), "the probe collected no test module"
    own = [m for m in new if not (m.rsplit(".", 1)[-1].startswith("test_") or m.endswith("conftest")
                                  or m.split(".")[0] in sys.stdlib_module_names or m.startswith("_pytest."))]
    assert len(own) <= 5, f"collecting {family} in a warm child imported {len(own)} modules itself: {own[:20]}"


def test_ops_that_follow_their_declared_conventions_are_deviations_not_failures():
    st = _status(_report("conformance_tests.meta.test_harness:declared_conventions_impl",
                         ["SAC-ENT-1", "SAC-DEFAULT-3", "PPO-ADV-1", "PPO-DEFAULT-3"], profile="mutant"))
    assert set(st.values()) == {"deviation"}, st



def test_the_repro_of_an_operation_on_networks_runs():
    """sac.losses takes networks and a dict batch: the repro rebuilds them (no module reprs, no bare tensor())."""
    rep = _report("conformance_tests.mutants.sac:losses_target_from_online_critic", ["SAC-LOSSES-1"], profile="mutant")
    entry = next(c for c in rep["clauses"] if c["id"] == "SAC-LOSSES-1")
    assert entry["status"] == "fail" and "impl.sac.losses(" in entry["repro"], entry.get("repro")
    assert "_load(" in entry["repro"]  # the networks travel serialised
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(entry["repro"], "repro", "exec"), {})
    assert "loss_" in out.getvalue()


def test_repro_literals_rebuild_their_values():

    ns = {"torch": torch, "np": np}
    for helper in _REPRO_HELPERS.values():
        exec(helper, ns)
    gen = torch.Generator().manual_seed(7)
    value = {"obs": torch.tensor([[1.0, float("nan")]]), "ids": [torch.tensor([0, 2]), (3, "x")],
             "device": torch.device("cpu"), "dtype": torch.float32, "inf": float("inf")}
    back = eval(_literal(value), ns)  # noqa: S307 - the literal is what the repro runs
    assert back["obs"].dtype == torch.float32 and torch.equal(back["obs"].isnan(), value["obs"].isnan())
    assert torch.equal(back["ids"][0], value["ids"][0]) and back["ids"][1] == (3, "x")
    assert back["device"] == torch.device("cpu") and back["dtype"] is torch.float32 and back["inf"] == float("inf")
    g2 = eval(_literal(gen), ns)  # noqa: S307
    assert torch.equal(torch.rand(3, generator=g2), torch.rand(3, generator=gen))
    net = TableModule(torch.randn(4, 3))
    back = eval(_literal(net), ns)  # noqa: S307
    assert isinstance(back, TableModule) and all(torch.equal(a, b) for a, b in zip(back.state_dict().values(),
                                                                                     net.state_dict().values()))


def test_the_examples_do_not_depend_on_the_rootdir(tmp_path):
    """Hypothesis keys a parametrised test's seed by its node id; the suite keys it by module and name, so
    ``pytest --pyargs``, a checkout and ``rlconform audit`` draw the same examples."""
    import subprocess
    import sys
    import textwrap

    pkg = tmp_path / "proj" / "pkg_seed_probe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "test_probe.py").write_text(textwrap.dedent('''
        import os
        import pytest
        from hypothesis import given, strategies as st

        @pytest.mark.parametrize("k", [1, 2])
        @given(st.integers(0, 10**9))
        def test_draws(k, x):
            with open(os.environ["PROBE_OUT"], "a") as f:
                f.write(f"{k} {x}\\n")
        '''))
    seen = []
    for rootdir in (tmp_path / "proj", pkg):
        out = tmp_path / f"draws_{len(seen)}.txt"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(rootdir),
                        "--impl", "reference_impl:make", "--profile", "ci", str(pkg / "test_probe.py")],
                       cwd=tmp_path / "proj", env={**os.environ, "PROBE_OUT": str(out), "PYTHONPATH": str(tmp_path / "proj")},
                       check=True, capture_output=True)
        seen.append(out.read_text())
    assert seen[0] == seen[1] and len(seen[0].splitlines()) >= 10


def _run_repro(snippet: str, where: str) -> None:
    """A repro compiles, names nothing undefined, and runs; the implementation may raise (that can be the
    finding), the snippet itself may not be broken."""
    code = compile(snippet, where, "exec")  # SyntaxError: a module repr, a bare tensor(...)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, {})
    except (NameError, SyntaxError) as e:
        raise AssertionError(f"{where}: the repro is broken: {type(e).__name__}: {e}\n{snippet}") from e
    except Exception:  # noqa: BLE001 - the implementation raising is a legitimate repro of an error finding
        pass


@pytest.mark.parametrize("mutant, clause", [
    ("conformance_tests.mutants.sac:losses_target_from_online_critic", "SAC-LOSSES-1"),
    ("conformance_tests.mutants.ppo:advantage_eps_inside_sqrt", "PPO-ADV-1"),
    ("conformance_tests.mutants.ccapo:macro_advantage_bessel_in_float32", "CCAPO-MACRO-1"),
    ("conformance_tests.mutants.isreshape:unclamped_ratio", "ISR-RATIO-1"),
])
def test_every_repro_of_a_failing_mutant_runs(mutant, clause):
    """Every failure's repro, in one failing mutant per family, is Python that runs."""
    rep = _report(mutant, [clause], profile="mutant")
    repros = [t["repro"] for c in rep["clauses"] for t in c.get("failing_tests", []) if t.get("repro")]
    assert repros, rep["clauses"]
    for i, snippet in enumerate(repros):
        _run_repro(snippet, f"{mutant} repro {i}")


def test_a_finite_difference_leaves_the_record_of_the_call_under_test():
    """A finite difference probes the operation at float64 points; the tolerance and the failure message must
    still be those of the call the test made (a bfloat16 call was held to float64's tolerance, and its failure
    named a float64 probe)."""
    from conformance_tests import harness
    impl = reference_impl.make()
    saved = harness.declared_capabilities()
    try:
        harness.set_capabilities(impl.capabilities)
        harness.begin_test(clauses=["SAC-TEMP-2"])
        sac = harness.FamilyProxy("sac", impl.sac)
        h, ht = torch.tensor([5.0], dtype=torch.bfloat16), torch.tensor([0.390625], dtype=torch.bfloat16)
        la = torch.tensor(0.0, dtype=torch.bfloat16, requires_grad=True)
        sac.temperature_loss(la, h, ht).backward()
        before = harness.recorded_calls()
        fd = harness.finite_difference(lambda x: sac.temperature_loss(x, h, ht), la.detach())
        assert harness.recorded_calls() == before and len(before) == 1
        assert harness.input_dtype(*before[-1][1:]) == torch.bfloat16
        harness.assert_close(la.grad, fd, "SAC-TEMP-2")  # bfloat16 rounds the mean 4.609375 to 4.625
        named = r"SAC-TEMP-2: sac\.temperature_loss\(0\.0, \[5\.0\], \[0\.390625\]\)"  # not a float64 probe
        with pytest.raises(pytest.fail.Exception, match=named):
            harness.assert_close(la.grad, 4.0, "SAC-TEMP-2")
    finally:
        harness.set_capabilities(saved)
        harness.end_test()


def test_an_op_that_turns_tf32_on_fails_and_the_setting_is_put_back():
    """TF32 (or cuDNN benchmarking, deterministic algorithms, the float32 matmul precision) switched on inside an
    op changes every later float32 matmul of the caller's process: the op's own clause fails and the setting is
    restored, on any device."""
    from conformance_tests import harness
    impl = reference_impl.make()
    ratio = impl.ppo.ratio

    def tf32_ratio(new, old):
        torch.backends.cuda.matmul.allow_tf32 = True
        return ratio(new, old)

    saved, before = harness.declared_capabilities(), torch.backends.cuda.matmul.allow_tf32
    try:
        harness.set_capabilities(impl.capabilities)
        harness.begin_test(clauses=["PPO-RATIO-1"])
        ppo = harness.FamilyProxy("ppo", types.SimpleNamespace(ratio=tf32_ratio))
        # torch ties the two: TF32 on is the float32 matmul precision 'high'
        with pytest.raises(pytest.fail.Exception, match=r"ppo\.ratio left (TF32|the float32 matmul precision 'high')"):
            ppo.ratio(torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
        assert torch.backends.cuda.matmul.allow_tf32 == before
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
        harness.set_capabilities(saved)
        harness.end_test()
