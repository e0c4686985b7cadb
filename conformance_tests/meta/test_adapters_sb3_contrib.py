"""Meta: the sb3-contrib adapter passes pre-flight with honest declarations, and each sb3-contrib finding
page's repro (the library alone) still prints the defect it reports."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from rlconform.spec import default_spec

from conformance_tests.preflight import run as preflight

pytestmark = pytest.mark.meta
FINDINGS = Path(__file__).resolve().parents[2] / "docs" / "audits" / "findings"


def repro_output(page: str, run_python) -> str:
    """Run the first python block of a finding page as a script of its own; its stdout (the page's claim)."""
    code = re.search(r"```python\n(.*?)```", (FINDINGS / page).read_text(encoding="utf-8"), re.S).group(1)
    assert len(code.strip().splitlines()) <= 10, f"{page}: a finding's repro has at most 10 lines"
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def check_declarations(impl_string: str, ops: dict[str, list[str]]) -> None:
    """Pre-flight passes, the adapter provides exactly ``ops``, and every declared convention is allowed."""
    pf = preflight(impl_string)
    assert {f: sorted(o) for f, o in pf.ops.items() if o} == {f: sorted(o) for f, o in ops.items()}
    for name, value in pf.impl.capabilities.get("conventions", {}).items():
        assert default_spec().convention(name).allows(value), (name, value)


def test_sb3_contrib_adapter_preflight():
    pytest.importorskip("sb3_contrib")
    check_declarations("conformance_tests.adapters.sb3_contrib:make", {"ppo": [
        "masked_distribution", "sample_actions", "evaluate_actions", "normalize_advantages", "ppo_update", "gae",
        "losses"], "sac": ["temperature_loss", "soft_update"]})


# Each finding page's repro, and what its output must show while the defect is there.
REPROS = {
    "sb3-contrib-one-row-minibatch-nan.md": ["params finite: False", "policy_gradient_loss: nan"],
    "sb3-contrib-maskable-categorical-float32-precision.md": [
        "log_prob: -0.69317626953125 expected: -0.6931471824645996"],
    "sb3-contrib-maskable-categorical-accepts-illegal-actions.md": [
        "log_prob: [-100000000.0, ", "probs: [0.3333333432674408"],
}


@pytest.mark.parametrize("page", sorted(REPROS))
def test_sb3_contrib_finding_repro_prints_the_defect(page, run_python):
    pytest.importorskip("sb3_contrib")
    out = repro_output(page, run_python)
    assert all(needle in out for needle in REPROS[page]), out
