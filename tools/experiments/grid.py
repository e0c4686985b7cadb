"""Run a grid of training runs in parallel processes, resumably.

A study is a list of :class:`Job` (one training run each, a trainer's own command line). Finished runs
(their ``metrics.jsonl`` has the requested number of updates) are skipped, so re-running the study's
command after a crash or a stop continues where it was. The wall time of every run is kept in
``OUT/timings.jsonl``: a page says how long its study took from that file, not from memory.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath


@dataclasses.dataclass(frozen=True)
class Job:
    """One run: ``rlconform train <trainer> <argv>`` writing ``run_dir/metrics.jsonl``."""

    key: tuple
    trainer: str
    argv: tuple[str, ...]
    run_dir: Path
    updates: int


def flags(d: dict) -> tuple[str, ...]:
    """``{"eval_every": 5}`` -> ``("--eval-every", "5")``: config fields as a trainer's command-line flags."""
    return tuple(x for k, v in d.items() for x in (f"--{k.replace('_', '-')}", str(v)))


def _last_update(lines) -> int:
    """1 + the largest ``update`` of metric records given as JSON lines (0 for none)."""
    return max((int(json.loads(ln).get("update", -1)) + 1 for ln in lines if ln.strip()), default=0)


def updates_done(run_dir: Path) -> int:
    """Updates logged in ``run_dir/metrics.jsonl`` (0 when the run never started)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    with path.open() as f:
        return _last_update(f)


def _run(job: Job, threads: int, log_dir: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / ("_".join(str(k) for k in job.key) + ".log")
    t0 = time.time()
    with log.open("w") as f:
        rc = subprocess.run([sys.executable, "-m", "rlconform.cli", "train", job.trainer, *job.argv],
                            stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    return {"key": list(job.key), "rc": rc, "start": round(t0), "wall_s": round(time.time() - t0, 1), "log": str(log),
            "updates": updates_done(job.run_dir)}


class Unfinished(RuntimeError):
    """Runs a later phase depends on did not finish (a crash, a kill): re-running the study continues them."""


def unfinished(jobs: list[Job]) -> list[Job]:
    return [j for j in jobs if updates_done(j.run_dir) < j.updates]


def require_finished(jobs: list[Job], what: str) -> None:
    """Raise :class:`Unfinished` naming the first of ``jobs`` that has not logged all its updates."""
    left = unfinished(jobs)
    if left:
        raise Unfinished(f"{len(left)} runs of the {what} did not finish (first: {'/'.join(map(str, left[0].key))}, "
                         "log in logs/); re-run the study's command to continue them")


def run_grid(jobs: list[Job], out: Path, *, parallel: int, threads: int = 1, echo=print, after=None) -> list[dict]:
    """Run the unfinished ``jobs``, ``parallel`` at a time; return one record per run that ran. ``after()`` is
    called as each run ends (see :func:`packer`)."""
    out = Path(out)
    todo = unfinished(jobs)
    echo(f"{len(jobs) - len(todo)} of {len(jobs)} runs already done; {len(todo)} to run, {parallel} at a time")
    records = []
    with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as ex, (out / "timings.jsonl").open("a") as tf:
        futures = {ex.submit(_run, j, threads, out / "logs"): j for j in todo}
        for i, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            rec = fut.result()
            tf.write(json.dumps(rec) + "\n")
            tf.flush()
            records.append(rec)
            status = "ok" if rec["rc"] == 0 else f"FAILED (exit {rec['rc']}, see {rec['log']})"
            echo(f"[{i}/{len(todo)}] {'/'.join(map(str, rec['key']))}: {rec['updates']} updates, "
                 f"{rec['wall_s']:.0f} s, {status}")
            if after is not None:
                after()
    return records


def read_timings(out: Path) -> list[dict]:
    """The records of ``out/timings.jsonl``, one per run that ran (a resumed run has one per attempt)."""
    path = Path(out) / "timings.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def elapsed_s(timings: list[dict]) -> float | None:
    """Wall-clock span from the first run's start to the last run's end (None when runs lack a start time,
    as records written before starts were kept do); interruptions between sessions are counted in."""
    spans = [(t["start"], t["start"] + t["wall_s"]) for t in timings if "start" in t]
    if not spans:
        return None
    return max(e for _, e in spans) - min(s for s, _ in spans)


def write_archive(root: Path, files: list[Path], path: Path) -> None:
    """``files`` (paths under ``root``) as a tar.gz whose bytes depend on their contents only (no times,
    owners or modes): re-publishing the same study leaves the tree clean. Written beside ``path`` and renamed
    over it, so a crash mid-write leaves the previous archive whole."""
    import gzip
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            data = Path(f).read_bytes()
            info = tarfile.TarInfo(Path(f).relative_to(root).as_posix())
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(buf.getvalue())
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- a study across machines
# A study outlives the machine it runs on only through an archive of its finished runs: a page's runs.tar.gz,
# or a --progress file re-packed after every run. Only these files travel; checkpoints, games and logs do not.
RUN_FILES = ("metrics.jsonl", "config.json")
STUDY_FILES = ("grid.json", "timings.jsonl", "random_policy.json", "chosen_lr.json", "command.txt")


def finished_runs(out: Path, updates: int) -> list[Path]:
    """Run directories under ``out`` whose ``metrics.jsonl`` has logged ``updates`` updates."""
    return sorted(p.parent for p in Path(out).glob("**/metrics.jsonl") if updates_done(p.parent) >= updates)


def pack(out: Path, updates: int, path: Path) -> int:
    """Archive every finished run under ``out`` (``RUN_FILES``) and the study's own files (``STUDY_FILES``
    outside run directories) into ``path``; returns the number of runs packed. Unfinished runs stay out: a
    run restored without its checkpoint could not resume."""
    out = Path(out)
    runs = finished_runs(out, updates)
    files = [rd / n for rd in runs for n in RUN_FILES if (rd / n).is_file()]
    in_run = {p.parent for p in out.glob("**/metrics.jsonl")}
    files += [p for n in STUDY_FILES for p in out.glob(f"**/{n}") if p.parent not in in_run and p.is_file()]
    write_archive(out, sorted(files), path)
    return len(runs)


def packer(out: Path, updates: int, progress: Path | None):
    """The ``after`` hook of :func:`run_grid` that re-packs ``progress`` as each run ends (None: no hook)."""
    return None if progress is None else (lambda: pack(out, updates, progress))


def read_archive(path: Path) -> dict[PurePosixPath, bytes]:
    """The regular files of a study archive by relative path; an absolute or ``..`` member is refused."""
    import tarfile

    files = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for m in tar.getmembers():
                rel = PurePosixPath(m.name)
                if rel.is_absolute() or ".." in rel.parts:
                    raise ValueError(f"{path}: member {m.name!r} would land outside the study directory")
                if m.isfile():
                    files[rel] = tar.extractfile(m).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ValueError(f"{path}: not a study archive ({e})") from e
    return files


def restore(path: Path, out: Path, updates: int, *, relocate=None) -> tuple[int, int, int]:
    """Unpack the finished runs of archive ``path`` into ``out``; returns (runs unpacked, runs ``out`` already
    had, runs left out because they had not finished). A run already in ``out`` with as many updates is kept;
    ``timings.jsonl`` records are merged, not replaced; other study files are written only where ``out`` has
    none (the study rewrites them). ``relocate(run_path, config)`` maps a run of an older layout to today's."""
    files = read_archive(path)
    out = Path(out)
    restored = present = skipped = 0
    for rel in sorted(r for r in files if r.name == "metrics.jsonl"):
        src = rel.parent
        if _last_update(files[rel].decode().splitlines()) < updates:
            skipped += 1
            continue
        cfg = json.loads(files.get(src / "config.json", b"{}"))
        dst = out / (relocate(src, cfg) if relocate else src)
        if updates_done(dst) >= updates:
            present += 1
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for n in RUN_FILES:
            if src / n in files:
                (dst / n).write_bytes(files[src / n])
        restored += 1
    in_run = {r.parent for r in files if r.name == "metrics.jsonl"}
    for rel, data in sorted(files.items()):
        if rel.name not in STUDY_FILES or rel.parent in in_run:
            continue
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.name == "timings.jsonl":
            have = dst.read_text().splitlines() if dst.exists() else []
            new = [ln for ln in data.decode().splitlines() if ln.strip() and ln not in have]
            dst.write_text("".join(ln + "\n" for ln in [*have, *new]))
        elif not dst.exists():
            dst.write_bytes(data)
    return restored, present, skipped
