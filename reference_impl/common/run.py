"""Run bookkeeping for the reference trainers.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per update, flushed at
once, so a crash loses at most the update in flight) and ``checkpoint.pt`` (written to a temporary
file and renamed, so a crash mid-write leaves the previous checkpoint intact). ``resume`` reloads
the checkpoint and truncates metrics written after it; a run that starts from no checkpoint starts
from an empty metrics file, so records of a killed earlier attempt never mix with the new ones.
Under torchrun only rank 0 is the ``writer``: the other ranks make the same checks and read the
checkpoint, but write nothing. A run directory has one writer at a time: the writer holds an
exclusive lock on ``.lock`` (released by the system when the process ends, however it ends), and a
second trainer on the same directory stops with :class:`RunDirBusy` before it touches a file.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def atomic_save(obj: Any, path: str | Path) -> None:
    """torch.save to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class DamagedCheckpoint(ValueError):
    """A checkpoint that exists but cannot be read back (cut short, overwritten, from another program)."""


def load_checkpoint(path: str | Path) -> Any | None:
    """The checkpoint at ``path`` (None when there is none); one that cannot be read is a
    :class:`DamagedCheckpoint` that says what to do, never torch's unpickling traceback."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises anything from EOFError to UnpicklingError and RuntimeError here
        raise DamagedCheckpoint(
            f"{path} is damaged and cannot be resumed from ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else 'no detail'}); "
            f"restore it, or start afresh in a new --out directory") from None


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", initial: int = 0,
             disable: bool | None = None):
    """A tqdm progress bar on stderr, off when stderr is not a terminal and RLCONFORM_PROGRESS is unset."""
    from tqdm.auto import tqdm

    if disable is None:
        disable = not (os.isatty(2) or os.environ.get("RLCONFORM_PROGRESS"))
    return tqdm(iterable, total=total, desc=desc, initial=initial, disable=disable, dynamic_ncols=True)


class RunDirBusy(FileExistsError):
    """Another live process is writing this run directory."""


_HELD: dict[str, list] = {}  # run directory -> [its open lock file, the RunDirs of this process sharing it]


def _lock(path: Path):
    """An exclusive, non-blocking lock on ``path/.lock`` holding the owner's pid; returns its key in
    ``_HELD`` (the lock lives as long as its file is open). The process that holds it may open the
    directory again (a resume in the same process). Where the system has no flock (not POSIX), no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None
    key = os.path.realpath(path)
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    f = open(path / ".lock", "a+", encoding="utf-8")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        owner = f.read().strip() or "unknown"
        f.close()
        raise RunDirBusy(f"{path} is being written by another run (pid {owner}); wait for it to end or choose "
                         "another --out") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    _HELD[key] = [f, 1]
    return key


def _unlock(key: str | None) -> None:
    held = _HELD.get(key) if key else None
    if held is not None:
        held[1] -= 1
        if held[1] == 0:
            del _HELD[key]
            held[0].close()


class RunDir:
    """``config.json`` + ``metrics.jsonl`` + ``checkpoint.pt`` under one directory, one writer at a time."""

    def __init__(self, path: str | Path, *, family: str, config: Any, resume: bool = False, writer: bool = True):
        self.path = Path(path)
        self.family = family
        self.writer = writer
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoint_path = self.path / "checkpoint.pt"
        if not writer:  # a data-parallel rank > 0: rank 0 checks the config and owns the files
            if not resume and self.checkpoint_path.exists():
                raise FileExistsError(f"{self.path} already holds a run; pass --resume or choose another --out")
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(self.path)  # before any file is read or written: a second writer changes nothing
        cfg = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
        cfg_path = self.path / "config.json"
        if resume and cfg_path.exists():
            old = json.loads(cfg_path.read_text())
            if old.get("config") != json.loads(json.dumps(cfg, default=str)):
                raise ValueError(f"{cfg_path}: resuming with a different config; start a new run directory")
        elif not resume and (self.path / "checkpoint.pt").exists():
            raise FileExistsError(f"{self.path} already holds a run; pass --resume or choose another --out")
        cfg_path.write_text(json.dumps({"family": family, "config": cfg}, indent=1, default=str))
        if not self.checkpoint_path.exists() and self.metrics_path.exists():
            self.metrics_path.write_text("")  # records of an attempt killed before its first checkpoint

    def _records(self) -> list[dict]:
        """The metrics records; a torn last line (a kill mid-write) is dropped with a warning naming it."""
        if not self.metrics_path.exists():
            return []
        lines = [ln for ln in self.metrics_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        out = []
        for n, ln in enumerate(lines, 1):
            try:
                out.append(json.loads(ln))
            except json.JSONDecodeError as e:
                where = f"{self.metrics_path}:{n}"
                if n < len(lines):
                    raise ValueError(f"{where}: not a JSON object ({e.msg}); the metrics file is damaged") from None
                warnings.warn(f"{where}: torn last line dropped ({e.msg})", stacklevel=3)
        return out

    def load(self) -> Any | None:
        """The last checkpoint (or None); metrics logged after it are dropped so the log matches."""
        ckpt = load_checkpoint(self.checkpoint_path)
        if ckpt is not None and self.writer and self.metrics_path.exists():
            last = ckpt.get("update", None)
            keep = [r for r in self._records() if last is None or r.get("update", -1) <= last]
            self.metrics_path.write_text("".join(json.dumps(r, default=float) + "\n" for r in keep))
        return ckpt

    def log(self, **metrics: Any) -> None:
        if not self.writer:
            return
        rec = {"family": self.family, "time": time.time(), **metrics}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, default=float) + "\n")
            f.flush()

    def save(self, state: dict) -> None:
        if not self.writer:
            return
        atomic_save(state, self.checkpoint_path)

    def metrics(self) -> list[dict]:
        return self._records()

    def close(self) -> None:
        """Release this RunDir's share of the lock; the last one frees the directory for other
        processes (collection, or the end of the process, does the same)."""
        _unlock(self.__dict__.pop("_lock", None))

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the module may be gone; the exit frees the lock
            pass
