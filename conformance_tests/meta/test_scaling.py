"""Meta-test: the suite under pytest-xdist gives the same clause verdicts as a serial run."""
from __future__ import annotations

import pytest
from rlconform.audit import clause_report, run_suite

pytestmark = [pytest.mark.meta, pytest.mark.long]
CLAUSES = ["SAC-TD-1", "SAC-TEMP-1", "SAC-TEMP-2", "SAC-V-1", "PPO-MASK-1"]


def _verdicts(expectations, **kw):
    report = clause_report(run_suite("conformance_tests.mutants.sac:v1_temperature_sign", clauses=CLAUSES,
                                     expectations=str(expectations), **kw))
    return {c["id"]: (c["status"], c["tests"], c.get("message")) for c in report["clauses"]}, report


def test_serial_and_two_workers_give_the_same_report(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("SAC-TEMP-2: kept on purpose\nSAC-CQL-1: matches nothing selected here\n")
    serial, rs = _verdicts(exp)
    parallel, rp = _verdicts(exp, jobs=2)
    assert serial == parallel
    assert serial["SAC-TEMP-2"][0] == "expected_fail"
    assert rs["warnings"] == rp["warnings"] == ["expectation for SAC-CQL-1 matches no collected test"]
    assert serial["SAC-TEMP-1"][0] == "fail" and serial["SAC-TD-1"][0] == "pass"  # the run says something
    assert rs["summary"]["exit_code"] == rp["summary"]["exit_code"] == 1
    assert rs["summary"]["tests_executed"] == rp["summary"]["tests_executed"]
