"""What a test process that died inside the code under test leaves behind for the report: the call it was
making (the call log, rewritten before every call) and the Python stack faulthandler wrote at the fatal signal.

One file of each per process. Under ``-n`` each xdist worker writes its own (``<path>.gwN``): the worker that
crashed is named by xdist, and its files name its call, not a sibling's."""
from __future__ import annotations

import os
from pathlib import Path

CALL_LOG_VAR, FAULT_LOG_VAR = "RLCONFORM_CALL_LOG", "RLCONFORM_FAULT_LOG"
_RUNNER_FRAMES = ("/_pytest/", "/pluggy/", "/hypothesis/", "/execnet/", "/xdist/")  # not what a crash report needs


def own_path(var: str) -> str | None:
    """This process's call or fault log (``var`` names the run's), or None outside an audit."""
    path, worker = os.environ.get(var), os.environ.get("PYTEST_XDIST_WORKER")
    return f"{path}.{worker}" if path and worker else path


def worker_paths(worker: str | None) -> tuple[Path | None, Path | None]:
    """The call and fault logs of ``worker`` (an xdist id such as ``gw1``, or None for a single process)."""
    def one(var):
        path = os.environ.get(var)
        return Path(f"{path}.{worker}" if worker else path) if path else None
    return one(CALL_LOG_VAR), one(FAULT_LOG_VAR)


def last_call(call_log: Path | None) -> str:
    """The call the process was making when it stopped ("" if it wrote none)."""
    return call_log.read_text(encoding="utf-8", errors="replace").strip() if call_log and call_log.exists() else ""


def details(call_log: Path | None, fault_log: Path | None) -> list[str]:
    """The lines a crash report adds: the last call and the user's frames at the crash. Both files are emptied,
    so a later crash of a new process never shows this one's."""
    lines = []
    if call := last_call(call_log):
        lines.append(f"  last call: {call}")
        call_log.write_text("", encoding="utf-8")
    if fault_log and fault_log.exists() and fault_log.stat().st_size:
        frames = [ln.strip() for ln in fault_log.read_text(encoding="utf-8", errors="replace").splitlines()
                  if ln.strip().startswith("File ") and not any(k in ln for k in _RUNNER_FRAMES)]
        lines += ["  Python stack at the crash (most recent call first):", *("    " + f for f in frames[:8])]
        fault_log.write_text("", encoding="utf-8")
    return lines
