"""Meta-test of report fidelity: a failure's message is the failure itself (the assertion's own line, or
the exception), the same whether the audit runs serially or on xdist workers (under ``--jobs`` a careless
reading takes the worker's header, ``[gw1] linux -- Python ...``, or a line of carets, for the message)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from rlconform import cli
from rlconform.audit import clause_report, run_suite

import reference_impl
from conformance_tests.impl import override

pytestmark = pytest.mark.meta
CLAUSES = ["CCAPO-C-1", "CCAPO-MACRO-1", "ISR-GAMMA-2"]


def failing_impl():
    """Three kinds of failure: a wrong value (the suite's message), a result of the wrong type that breaks the
    test's own code (a foreign exception), and an operation that raises (an implementation error)."""
    base = reference_impl.make()
    criticality, macro = base.ccapo.criticality, base.ccapo.macro_advantage

    def reward_gamma(*args, **kwargs):
        raise RuntimeError("gamma table not loaded")

    impl = override(base, "ccapo", criticality=lambda *a, **k: 2 * criticality(*a, **k),
                    macro_advantage=lambda r, **k: np.asarray(macro(r, **k)))
    return override(impl, "isreshape", reward_gamma=reward_gamma)


def _messages(jobs: int) -> dict[str, str]:
    report = clause_report(run_suite("conformance_tests.meta.test_messages:failing_impl", clauses=CLAUSES,
                                     profile="mutant", jobs=jobs))
    return {c["id"]: re.sub(r"0x[0-9a-f]+", "0x…", c.get("message") or "") for c in report["clauses"]
            if c["id"] in CLAUSES}


def test_messages_are_the_failures_and_do_not_depend_on_xdist():
    serial, parallel = _messages(1), _messages(2)
    assert serial == parallel
    assert set(serial) == set(CLAUSES)
    for cid, msg in serial.items():
        first = msg.splitlines()[0]
        assert not first.startswith("[gw") and not re.fullmatch(r"[\s^~_\-\"']*", first), (cid, msg)
    assert re.match(r"got .*, but should be .* \[CCAPO-C-1: ccapo\.criticality\(", serial["CCAPO-C-1"])
    # a numpy result where the contract says Tensor: the message names it and the contract
    assert serial["CCAPO-MACRO-1"].startswith("got 'ccapo.macro_advantage returned a numpy float64 array"), \
        serial["CCAPO-MACRO-1"]
    assert "The contract: ccapo.macro_advantage returns Tensor" in serial["CCAPO-MACRO-1"]
    assert "raised RuntimeError: gamma table not loaded" in serial["ISR-GAMMA-2"]


def test_train_help_lists_the_trainers_and_exits_0(capsys):

    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.TRAINERS)


def test_gate_takes_a_run_directory(tmp_path, capsys):
    from pathlib import Path

    assert cli.main(["gate", str(tmp_path)]) == 2
    assert "without metrics.jsonl" in capsys.readouterr().err
    published = Path(__file__).resolve().parents[2] / "docs" / "results" / "sac" / "gates.jsonl"
    if not published.exists():
        pytest.fail("the published SAC gate record is missing")
    (tmp_path / "gates.jsonl").write_bytes(published.read_bytes())
    by_dir = cli.main(["gate", str(tmp_path)])
    out_dir = capsys.readouterr().out
    assert by_dir == cli.main(["gate", str(tmp_path / "gates.jsonl")])
    assert out_dir.splitlines()[1:] == capsys.readouterr().out.splitlines()[1:]  # the same verdicts


def test_spec_show_names_the_document_not_its_archive_file(capsys):

    assert cli.main(["spec", "show", "SAC-TD-1"]) == 0
    source = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("source")][0]
    assert ".txt" not in source and "SAC V2 v1.0.0" in source, source
