"""Meta-tests of the GPU scripts (tools/gpu_prepare.sh, tools/gpu_checks.sh).

CI never has a GPU and a lent one comes for minutes, so a stale path or a renamed flag in the checks
would only show on that machine, costing its run. Here every command the checks give is checked against
what this checkout has: the pytest paths exist, each module or CLI accepts every flag it is given, and
each trainer named exists.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.meta

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "tools" / "gpu_checks.sh", ROOT / "tools" / "gpu_prepare.sh"]


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script, continuation lines joined and pipes or lists split;
    ``timeout N`` and leading ``VAR=value`` assignments are dropped."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\|\||&&|[|;]", line):
            try:
                words = shlex.split(part)
            except ValueError:  # a quote spanning a split point: not a command this test reads
                continue
            while words and (words[0] == "timeout" or re.fullmatch(r"\d+|[A-Z_]+=.*", words[0])):
                words = words[1:]
            if words:
                out.append(words)
    return out


def python_commands(script: str) -> list[tuple[str, list[str]]]:
    """(module, argv) of every ``python3 -m MODULE ...``, and of ``rlconform ...`` as rlconform.cli."""
    found = []
    for words in commands(script):
        if words[0] in ("python3", "python") and len(words) > 2 and words[1] == "-m":
            found.append((words[2], words[3:]))
        elif words[0] == "rlconform":
            found.append(("rlconform.cli", words[1:]))
    return found


def help_text(module: str, argv: list[str]) -> str:
    """What ``python -m MODULE *argv --help`` prints, run in this process (one import of torch)."""
    import importlib

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        importlib.import_module(module).main([*argv, "--help"])
    return buf.getvalue()


def flags(argv: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in argv if w.startswith("--")]


def _leading_words(argv: list[str]) -> list[str]:
    """The subcommand words before the first flag (``audit``, ``train ccapo-textworld``)."""
    words = []
    for w in argv:
        if w.startswith("-"):
            break
        words.append(w)
    return words


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_gpu_scripts_parse_as_bash(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_pytest_path_in_the_checks_exists():
    named = [w for mod, argv in python_commands(SCRIPTS[0].read_text()) if mod == "pytest"
             for w in argv if re.fullmatch(r"(conformance_tests|tools)[\w./-]*(::\S+)?", w)]
    assert named, "the checks run no pytest path"
    missing = [w for w in named if not (ROOT / w.split("::")[0]).exists()]
    assert not missing, f"tools/gpu_checks.sh runs tests that do not exist: {missing}"


def _cli_cases() -> list[tuple[str, list[str], list[str]]]:
    """(module, leading argv for --help, flags given) for every tools/ or rlconform command."""
    cases = []
    for script in SCRIPTS:
        for mod, argv in python_commands(script.read_text()):
            if mod == "pytest" or mod.startswith("pip"):
                continue
            if mod == "tools.benchmarks.bench_trainer_busy":  # its flags, then a trainer and the trainer's
                i = next(i for i, w in enumerate(argv)
                         if not w.startswith("-") and (i == 0 or not argv[i - 1].startswith("--")))
                cases.append((mod, [], flags(argv[:i])))
                cases.append(("rlconform.cli", ["train", argv[i]], flags(argv[i + 1:])))
            elif mod == "rlconform.cli":
                lead = _leading_words(argv)
                cases.append((mod, lead, flags(argv[len(lead):])))
            else:
                cases.append((mod, [], flags(argv)))
    return cases


@pytest.mark.parametrize("module, lead, given", [pytest.param(*c, id=" ".join([c[0], *c[1]])) for c in _cli_cases()])
def test_every_flag_the_gpu_scripts_give_is_accepted(module, lead, given):
    if lead[:1] == ["train"]:
        from rlconform.cli import TRAINERS

        assert lead[1] in TRAINERS, f"no trainer {lead[1]!r}; `rlconform train` has {sorted(TRAINERS)}"
    text = help_text(module, lead)
    unknown = [f for f in given if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    assert not unknown, f"`{module} {' '.join(lead)}` does not take {unknown}"


def test_every_config_override_the_gpu_scripts_give_the_sac_trainer_applies():
    """``--set KEY=VALUE`` reaches the trainer's Config only on the GPU machine: an unknown key or a value of
    the wrong type there would cost the run, so each is applied here."""
    from reference_impl.sac.trainer import Config, apply_overrides

    sets = [argv[i + 1] for script in SCRIPTS for mod, argv in python_commands(script.read_text())
            if mod == "tools.benchmarks.bench_sac_trainer" for i, w in enumerate(argv[:-1]) if w == "--set"]
    assert sets, "the checks give the SAC trainer no override (the test reads the wrong commands)"
    apply_overrides(Config(), sets)  # raises on an unknown field or a value of the wrong type


def test_the_command_reader_sees_continuations_pipes_and_timeouts():
    script = ('say "x"\ntimeout 90 python3 -m tools.a --json "$R/a b.json" x \\\n  --out /tmp/o 2>&1 | tail -2\n'
              'A=1 rlconform audit --device cuda > /tmp/l 2>&1 # note\n')
    assert python_commands(script) == [
        ("tools.a", ["--json", "$R/a b.json", "x", "--out", "/tmp/o", "2>&1"]),
        ("rlconform.cli", ["audit", "--device", "cuda", ">", "/tmp/l", "2>&1"]),
    ]
