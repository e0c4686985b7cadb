"""The suite's options, one table: the pytest plugin registers them (``--rlconform-NAME`` and, where free,
``--NAME``), the runtime reads them, and ``rlconform audit`` offers the same choices."""
from __future__ import annotations

import os

DEFAULT_TIMEOUT = 120.0  # seconds a test may spend inside the implementation
# Operations that hung a test process so deeply that the audit killed it (set by the runner for the process it
# starts next): every later call of one fails at once, so one such hang costs one test budget, not one per clause.
KILLED_OPS_VAR = "RLCONFORM_KILLED_OPS"
PROFILES = ("ci", "release", "mutant", "smoke")
# (namespaced name, short alias, argparse keywords)
OPTIONS = (
    ("impl", True, dict(default=None, help="implementation factory 'module:factory' (default: the bundled "
                                           "reference; env RLCONFORM_IMPL)")),
    ("device", True, dict(default=None, help="torch device the inputs are built on: cpu, cuda, cuda:N, or sim (a "
                                                "CUDA device simulated on the CPU) (default: cpu; env RLCONFORM_DEVICE)")),
    ("profile", True, dict(default=None, choices=PROFILES,
                           help="hypothesis profile: ci (derandomised, fast), release (more examples), "
                                "mutant (ci without shrinking), smoke (ci with 5 examples: every input structure, "
                                "few values); env RLCONFORM_PROFILE")),
    ("clauses", True, dict(default=None, help="comma-separated clause ids: run only their tests")),
    ("families", True, dict(default=None, help="comma-separated families: run only their clauses' tests")),
    ("expectations", True, dict(default=None, help="YAML of known failures (see the README)")),
    ("report", False, dict(default=None, help="write per-test results as JSON here")),
    ("events", False, dict(default=None, help="append one JSON line per collection/test event here (progress)")),
    ("timeout", False, dict(default=None, type=float,
                            help="seconds a test may spend inside the implementation (default 120; 0: no limit)")),
    ("seed", False, dict(default=None, type=int, help="hypothesis seed for the release profile (recorded)")),
    ("skip-file", False, dict(default=None, help="a file of node ids not to run (used by audit after a hang)")),
    ("skip-id-check", False, dict(action="store_true", default=False, help="do not reject unknown clause ids")),
)


def dest(name: str) -> str:
    return "rlconform_" + name.replace("-", "_")


def option(config, name: str, env: str | None = None, default=None):
    """An rlconform option: the command line first, then the environment variable, then the default."""
    value = config.getoption(dest(name), None)
    if value is None and env:
        value = os.environ.get(env)
    return default if value is None else value
