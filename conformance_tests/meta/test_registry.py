"""What an adapter can declare beyond the seed's choices: the temperature's variable, an α left attached in the
actor loss, hyper-parameters the library hard-codes, code that steps itself, and the documented result dicts.

Each declaration is exercised on a reference variant that behaves like such a library (d3rlpy's discrete SAC has
all four): declared, the clauses pass as deviations with the right entries; undeclared, the same code fails.
"""
from __future__ import annotations

import math
import re

import pytest
import torch
from rlconform.audit import clause_report, render_checklist, run_suite
from rlconform.spec import default_spec

import reference_impl
from conformance_tests import contract, harness
from conformance_tests.adapters import measured_loss, step_gradients
from conformance_tests.impl import override
from conformance_tests.preflight import PreflightError, check_capabilities
from conformance_tests.preflight import run as preflight

pytestmark = pytest.mark.meta
HERE = "conformance_tests.meta.test_registry"
CLAUSES = ["SAC-TEMP-2", "SAC-LOSSES-1", "SAC-LOSSES-2"]
HARD_KAPPA = 0.98
LIBRARY_LIKE = {"conventions": {"temperature_param": "alpha", "alpha_in_actor_loss": "attached_unstepped"},
                "pinned": {"sac.losses": {"kappa": HARD_KAPPA}}, "steps_itself": {"sac.losses": ["loss_alpha"]}}


def _library_like_losses(ref):
    """sac.losses as d3rlpy computes them: κ hard-coded, α attached in the actor loss, and the temperature loss
    written in α and stepped by the library itself (measured back through an SGD step at lr 1)."""
    def losses(policy, critic, target_critic, batch, *, log_alpha, gamma, kappa=0.9, delta=1.0, top_p=1.0):
        out = dict(ref.sac.losses(policy, critic, target_critic, batch, log_alpha=log_alpha.detach(), gamma=gamma,
                                  kappa=HARD_KAPPA, delta=delta, top_p=top_p))
        logits, legal = policy(batch["obs"]), batch["legal_mask"]
        with torch.no_grad():
            gap = out["entropy"] - HARD_KAPPA * legal.sum(-1).to(logits.dtype).log().mean()
            probs = torch.softmax(logits.masked_fill(~legal, -math.inf), -1)
            pi_log_pi = (probs * torch.log(probs.clamp_min(1e-30))).sum(-1).mean()
        alpha = log_alpha.exp()
        out["loss_actor"] = out["loss_actor"] + (alpha - alpha.detach()) * pi_log_pi  # same value, α attached
        own = torch.nn.Parameter(log_alpha.detach().clone())  # the library's own leaf and optimiser
        opt = torch.optim.SGD([own], lr=1.0)

        def step():
            opt.zero_grad()
            (own.exp() * gap).backward()
            opt.step()
        (grad,) = step_gradients(step, [own])
        out["loss_alpha"] = measured_loss(alpha.detach() * gap, {log_alpha: grad})
        return out
    return losses


def _library_like(declare: bool):
    ref = reference_impl.make()
    impl = override(ref, "sac", losses=_library_like_losses(ref),
                    temperature_loss=lambda log_alpha, entropy, target: log_alpha.exp() * (entropy - target).detach().mean())
    impl.capabilities = {"errors_name_clauses": True, **(LIBRARY_LIKE if declare else {})}
    return impl


def library_like_declared():
    return _library_like(True)


def library_like_undeclared():
    return _library_like(False)


def losses_without_loss_alpha():
    ref = reference_impl.make()
    return override(ref, "sac", losses=lambda *a, **k: {key: v for key, v in ref.sac.losses(*a, **k).items()
                                                        if key != "loss_alpha"})


def test_declared_registry_entries_turn_failures_into_deviations():
    pf = preflight(f"{HERE}:library_like_declared", families=["sac"])
    report = clause_report({**run_suite(pf.impl_string, clauses=CLAUSES), **pf.info()})  # as rlconform audit does
    status = {c["id"]: c for c in report["clauses"]}
    assert {c: status[c]["status"] for c in CLAUSES} == dict.fromkeys(CLAUSES, "deviation"), report["clauses"]
    named = {d["convention"]: d for c in CLAUSES for d in status[c]["deviations"]}
    assert named["temperature_param"]["declared"] == "alpha"
    assert named["alpha_in_actor_loss"]["declared"] == "attached_unstepped"
    pinned = named["pinned sac.losses(kappa)"]
    assert (pinned["declared"], pinned["seed"]) == (HARD_KAPPA, 0.9) and "hard-coded" in pinned["consequence"]
    assert "alpha_in_actor_loss" in {d["convention"] for d in status["SAC-LOSSES-2"]["deviations"]}
    assert report["run_info"]["steps_itself"] == {"sac.losses": ["loss_alpha"]}
    text = render_checklist(report)
    assert "own optimiser step" in text and "`sac.losses` loss_alpha" in text and "## Deviations" in text


def test_the_same_code_undeclared_fails_each_clause():
    report = clause_report(run_suite(f"{HERE}:library_like_undeclared", clauses=CLAUSES, profile="mutant"))
    status = {c["id"]: c["status"] for c in report["clauses"]}
    assert status == dict.fromkeys(CLAUSES, "fail"), status


def test_a_missing_documented_key_fails_naming_the_key_and_its_clause():
    report = clause_report(run_suite(f"{HERE}:losses_without_loss_alpha", clauses=["SAC-LOSSES-1"]))
    (clause,) = report["clauses"]
    assert clause["status"] == "fail"
    assert "returned no 'loss_alpha' (SAC-TEMP-2)" in clause["message"], clause["message"]


def test_measured_loss_carries_the_gradient_of_the_library_step():
    log_alpha = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)
    own = torch.nn.Parameter(log_alpha.detach().clone())
    opt = torch.optim.SGD([own], lr=1.0)
    gap = torch.tensor(0.3, dtype=torch.float64)

    def step():
        opt.zero_grad()
        (own.exp() * gap).backward()
        opt.step()
    (grad,) = step_gradients(step, [own])
    measured_loss(torch.tensor(1.0), {log_alpha: grad}).backward()
    assert log_alpha.grad.item() == pytest.approx(math.exp(-0.7) * 0.3, rel=1e-12)


@pytest.mark.parametrize("caps, says", [
    ({"pinned": {"sac.losses": {"kapa": 0.98}}}, "unknown: ['kapa']"),
    ({"pinned": {"sac.loss": {"kappa": 0.98}}}, "not a contract op"),
    ({"pinned": {"sac.losses": [0.98]}}, "must map keyword"),
    ({"steps_itself": {"sac.losses": "loss_alpha"}}, "must list output keys"),
    ({"conventions": {"temperature_param": "log"}}, "not an allowed value"),
    ({"conventions_by_clause": {"SAC-TEMP-2": {"advantage_std": {"ddof": 1, "eps": 1e-8, "eps_mode": "add"}}}},
     "not a convention of SAC-TEMP-2"),
    ({"conventions_by_clause": {"PPO-NOPE-1": {}}}, "not a clause"),
    ({"conventions_by_clause": {"PPO-ADV-1": {"advantage_std": {"ddof": 2, "eps": 1e-8, "eps_mode": "add"}}}},
     "not an allowed value"),
])
def test_preflight_rejects_a_misspelt_declaration(caps, says):
    with pytest.raises(PreflightError) as e:
        check_capabilities(caps, "pkg:make")
    assert says in str(e.value), str(e.value)


def test_every_documented_output_names_a_clause_of_its_family():
    spec = default_spec()
    for family in contract.FAMILIES:
        for op in contract.op_names(family):
            documented = contract.outputs(f"{family}.{op}")
            if documented:
                assert 'OUTPUTS["' in getattr(contract.protocol(family), op).__doc__, f"{family}.{op}"
            for key, out in documented.items():
                assert spec.clauses[out.clause].family == family, (family, op, key, out.clause)


def _raising_sentences(doc: str) -> list[str]:
    """The sentences of a docstring that say an input raises (not "descent raises α")."""
    sentences = re.split(r"(?<=[.;])\s+", " ".join(doc.split()))
    return [t for t in sentences if re.search(r"\braises?\b(?!\s+α)", t)]


def test_every_error_a_contract_demands_names_the_clause_its_message_must_carry():
    """With ``errors_name_clauses`` an error must name its clause, so the contract says which: a sentence
    saying that some input raises names a clause of the operation's family."""
    spec = default_spec()
    for family in contract.FAMILIES:
        for op in contract.op_names(family):
            for sentence in _raising_sentences(getattr(contract.protocol(family), op).__doc__ or ""):
                named = re.findall(r"\b[A-Z]+-[A-Z0-9]+-\d+\b", sentence)
                assert named, f"{family}.{op}: {sentence!r} names no clause"
                assert all(spec.clauses[c].family == family for c in named), (family, op, named)


def test_a_signature_that_does_not_fit_points_at_the_contract_operation():
    from conformance_tests.preflight import signature_problem

    def td_target(reward, done):
        return reward

    msg = signature_problem("sac", "td_target", td_target)
    path, line = re.search(r"\(the contract: (.+):(\d+)\)$", msg).groups()
    assert path.endswith("contract/sac.py")
    assert "def td_target" in open(path, encoding="utf-8").read().splitlines()[int(line) - 1]


def _rejection_clauses(path) -> list[tuple[int, str]]:
    """(line, clause) for each ``assert_rejects`` call of a test module: the clause its failure is filed
    under (the first of a tuple; a module-level name such as ``CLAUSE`` resolved)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Constant) for t in node.targets if isinstance(t, ast.Name)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "assert_rejects" and node.args:
            first = node.args[0]
            first = first.elts[0] if isinstance(first, ast.Tuple) else first
            clause = first.value if isinstance(first, ast.Constant) else names.get(getattr(first, "id", None))
            out.append((node.lineno, clause))
    return out


def test_a_rejected_input_is_filed_under_a_clause_that_asks_for_the_error():
    """A bad-input check fails the clause it is filed under: that clause must be an input clause, or one
    whose own text makes the input an error (or a declared convention may). Filed under a formula that
    says nothing of errors, a SHOULD input check would fail a MUST clause."""
    from pathlib import Path

    spec = default_spec()
    root = Path(contract.__file__).resolve().parents[1]
    seen = 0
    for path in sorted(root.glob("test_*.py")):
        for line, clause in _rejection_clauses(path):
            seen += 1
            assert clause in spec.clauses, f"{path.name}:{line}: {clause!r} is not a clause"
            c = spec.clauses[clause]
            asks = c.kind == "input" or re.search(r"\b(rais|error|reject)", c.statement) or c.conventions
            assert asks, f"{path.name}:{line}: {clause} ({c.level} {c.kind}) says nothing of rejecting input"
    assert seen > 40  # the scan found the suite's rejections


def test_the_raising_sentence_reader_tells_inputs_from_other_uses():
    got = _raising_sentences("x -> y. An empty mask raises (ISR-INPUT-1). Descent raises α on a deficit; p < 0 raise.")
    assert got == ["An empty mask raises (ISR-INPUT-1).", "p < 0 raise."]


def test_a_convention_declared_for_a_clause_overrides_the_library_wide_one():
    whiten = {"ddof": 1, "eps": 1e-8, "eps_mode": "add"}
    group = {"ddof": 1, "eps": 1e-6, "eps_mode": "add"}
    saved = harness.declared_capabilities()
    try:
        harness.set_capabilities({"conventions": {"advantage_std": group},
                                  "conventions_by_clause": {"PPO-ADV-1": {"advantage_std": whiten}}})
        assert harness.convention("advantage_std", "PPO-ADV-1", record=False) == whiten
        assert harness.convention("advantage_std", "CCAPO-MACRO-1", record=False) == group
    finally:
        harness.set_capabilities(saved)


def _constant_value_loss(declare: bool):
    """A value loss computed without a graph (as a library that logs .item() floats would give it)."""
    ref = reference_impl.make()
    impl = override(ref, "ppo", value_loss=lambda values, returns: ref.ppo.value_loss(values, returns).detach())
    ops = [f"ppo.{op}" for op in contract.op_names("ppo") if op != "value_loss"]
    impl.capabilities = {"errors_name_clauses": True, **({"differentiable": ops} if declare else {})}
    return impl


def constant_value_loss_declared():
    return _constant_value_loss(True)


def constant_value_loss_undeclared():
    return _constant_value_loss(False)


def test_a_gradient_check_on_a_declared_constant_is_not_applicable_wherever_the_test_forgot_to_ask():
    # test_no_gradient_into_advantage_or_returns calls value_loss(...).backward() without require_differentiable
    def outcome(factory):
        tests = run_suite(f"{HERE}:{factory}", clauses=["PPO-GRAD-2"])["tests"]
        (record,) = [t for nodeid, t in tests.items() if nodeid.endswith("test_no_gradient_into_advantage_or_returns")]
        return record
    declared = outcome("constant_value_loss_declared")
    assert declared["outcome"] == "not_applicable" and "declares carries none" in declared["message"], declared
    assert outcome("constant_value_loss_undeclared")["outcome"] in ("fail", "error")
