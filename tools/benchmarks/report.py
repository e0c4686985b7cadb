"""Regenerate the performance page (docs/performance/index.md) from the benchmarks' raw JSON.

``python -m tools.benchmarks.report --run`` runs every benchmark first (script benchmarks as
subprocesses, the pytest-benchmark ones with ``--benchmark-json``), each writing its JSON into
docs/performance/raw/; without ``--run`` the page is rebuilt from the JSON already there. Rows come
from the files' devices: a GPU row appears only when a GPU run wrote a ``*_cuda.json``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tools.benchmarks.spread import BUSY_SPREAD, round_spread

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "performance" / "index.md"
RAW = PAGE.parent / "raw"

SCRIPTS = ("bench_sac_update", "bench_ppo_epoch", "bench_stdb", "bench_host_syncs", "bench_dispatch", "bench_suite_time")
CPU_ONLY = {"bench_stdb", "bench_dispatch"}  # SQLite and Python dicts; dispatch counts are device-independent
PYTEST_BENCH = {"top_p": "bench_sac_top_p"}  # -k filters (naming the file collects it twice)


def run_all(device: str) -> None:
    for name in SCRIPTS:
        if name in CPU_ONLY and device != "cpu":
            continue
        runs = ["--runs", "3"] if name == "bench_suite_time" else []  # a wall time, not a ratio: the median of 3
        subprocess.run([sys.executable, "-m", f"tools.benchmarks.{name}", "--device", device, *runs], cwd=ROOT,
                       check=True)
    if device == "cpu":  # the pytest-benchmark files run on the CPU only
        for key, module in PYTEST_BENCH.items():
            subprocess.run([sys.executable, "-m", "pytest", "tools/benchmarks", "-k", module, "-q",
                            "-p", "no:cacheprovider", f"--benchmark-json={RAW / f'{key}_cpu.json'}"], cwd=ROOT, check=True)


def _load(name: str) -> dict | None:
    p = RAW / name
    return json.loads(p.read_text()) if p.exists() else None


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def dev(d: dict) -> str:
    """The row's device tag; a GPU row names the card, its driver and torch (from the file's stamp)."""
    prov, device = d.get("provenance", {}), d.get("device", "cuda")
    gpu = prov.get("gpu")
    if not gpu:
        return f"[{device}]"
    return f"[{device}: {gpu['name']}, driver {gpu['driver']}, torch {prov.get('versions', {}).get('torch', '?')}]"


def _secs(t: float) -> str:
    return f"{t:.2f} s" if t >= 0.1 else f"{t * 1e3:.1f} ms"


def busy_note(d: dict) -> str:
    """A marker for a row measured while the machine was busy ('' for a quiet run, or no per-round times)."""
    spread = round_spread(d.get("times_s") or {})
    return (f" (busy machine: rounds varied {spread:.0%}; rerun for a figure to rely on)"
            if spread > BUSY_SPREAD else "")


def sac_rows(d: dict) -> list[list[str]]:
    med, gf, pct = d["median_s"], d["gflops"], d["pct_of_peak"]
    sh = d["shape"]
    rows = [[f"SAC update at V2 scale (B {sh['batch']}, \\|A\\| {sh['actions']}, obs {sh['obs']}, "
             f"hidden {sh['hidden']}, Top-p {sh['top_p']}, CQL, BC) {dev(d)}",
             f"{_secs(med['reference'])}, {gf['reference']:.1f} GFLOP/s ({pct['reference']:.0f}% of the "
             f"{d['matmul_peak_gflops']:.1f} GFLOP/s fp32 matmul peak)",
             f"TorchRL `DiscreteSACLoss` + Adam: {_secs(med['torchrl'])}, {gf['torchrl']:.1f} GFLOP/s",
             f"**{d['ratio']:.2f}**{busy_note(d)}",
             f"≥ 1.25 and ≥ 40% of peak: {_met(d['ratio'] >= 1.25 and pct['reference'] >= 40)}"
             if d["device"] == "cpu" else "— (eager; the GPU's update is the captured one, next row)"]]
    if "reference_graph" in med:  # on CUDA: the trainer's update, replayed from a CUDA graph
        ratio = med["torchrl"] / med["reference_graph"]
        rows.append([f"SAC update at V2 scale, captured as one CUDA graph and replayed {dev(d)}",
                     f"{med['reference_graph'] * 1e3:.1f} ms (eager: {med['reference'] * 1e3:.1f} ms)",
                     f"TorchRL `DiscreteSACLoss` + Adam: {med['torchrl'] * 1e3:.1f} ms",
                     f"**{ratio:.2f}**{busy_note(d)}", f"≥ 1.5: {_met(ratio >= 1.5)}"])
    if "reference_graph_compiled" in med:  # the same, its fused heads torch.compile'd (compile=True)
        ratio = med["torchrl"] / med["reference_graph_compiled"]
        rows.append([f"SAC update at V2 scale, fused heads torch.compile'd, captured and replayed {dev(d)}",
                     f"{med['reference_graph_compiled'] * 1e3:.1f} ms (captured, not compiled: "
                     f"{med['reference_graph'] * 1e3:.1f} ms)",
                     f"TorchRL `DiscreteSACLoss` + Adam: {med['torchrl'] * 1e3:.1f} ms",
                     f"**{ratio:.2f}**{busy_note(d)}", f"≥ 1.5: {_met(ratio >= 1.5)}"])
    k = d.get("kernel_launches") or {}
    if k:
        ours = k.get("reference_graph", k["reference"])
        rows.append([f"CUDA kernel launches per SAC update {dev(d)}",
                     f"{ours}" + (f" (a graph replay; eager: {k['reference']})" if "reference_graph" in k else ""),
                     f"TorchRL {k['torchrl']}", f"**{k['torchrl'] / ours:.2f}**", f"≤ 200: {_met(ours <= 200)}"])
    rss = d.get("peak_rss_bytes") or {}
    if rss:
        rows.append([f"peak RSS during the SAC update [{d['device']}]", _gib(rss["reference"]),
                     f"TorchRL {_gib(rss['torchrl'])}", f"{rss['torchrl'] / rss['reference']:.2f}",
                     f"≤ TorchRL: {_met(rss['reference'] <= rss['torchrl'])}"])
    return rows


def top_p_rows(d: dict) -> list[list[str]]:
    rows = []
    for b in d["benchmarks"]:
        kind = b["extra_info"].get("kind")
        ref, plain = b["stats"]["median"], b["extra_info"].get("plain_sort_median_s")
        if kind is None or plain is None:
            continue
        rows.append([f"Top-p select + soft value, 2048 × 6000, {kind} [cpu]", f"{ref:.3f} s",
                     f"plain sort + cumsum {plain:.3f} s", f"**{plain / ref:.2f}**",
                     f"≥ 2: {_met(plain / ref >= 2)}"])
    return rows


def ppo_rows(d: dict) -> list[list[str]]:
    r = d["samples_per_s"]
    return [[f"masked PPO epoch, N {d['shape']['N']}, minibatch {d['shape']['minibatch']} {dev(d)}",
             f"{r['reference'] / 1e3:.1f}k samples/s",
             f"sb3-contrib `MaskablePPO.train()` {r['sb3_contrib'] / 1e3:.1f}k",
             f"**{d['ratio']:.2f}**{busy_note(d)}", f"≥ 1.5: {_met(d['ratio'] >= 1.5)}"]]


def stdb_rows(d: dict) -> list[list[str]]:
    if "benchmarks" in d:  # a pytest-benchmark file (rows one after another, not interleaved)
        rate = {b["name"].removeprefix("test_"): b["extra_info"].get("edge_updates_per_s") for b in d["benchmarks"]}
    else:
        rate = d["edge_updates_per_s"]
    sq, raw, raw_int, mem, dct = (rate.get(k) for k in ("sqlite_store", "raw_executemany", "raw_int_executemany",
                                                        "memory_store", "dict"))
    if not (sq and raw):
        return []
    # The target was set where raw executemany ran 1.31M/s: 500k/s is 0.38x that floor on any machine.
    peer = f"raw sqlite3 `executemany` upsert, text keys {raw / 1e3:.0f}k"
    peer += f"; the same with our integer keys (the schema's floor) {raw_int / 1e3:.0f}k" if raw_int else ""
    peer += f"; dict {dct / 1e3:.0f}k" if dct else ""
    return [["STDB edge updates/s (trajectory batches, one transaction each) [cpu]",
             f"SQLite {sq / 1e3:.0f}k; in-memory store {mem / 1e3:.0f}k" if mem else f"SQLite {sq / 1e3:.0f}k",
             peer, f"**{sq / raw:.2f}**" + (f" ({sq / raw_int:.2f} of the integer floor)" if raw_int else "")
             + busy_note(d),
             f"≥ 500k/s: {_met(sq >= 5e5)} here; as a ratio, ≥ 0.38 of raw text `executemany`: "
             f"{_met(sq / raw >= 500 / 1310)}"]]


def sync_rows(d: dict) -> list[list[str]]:
    s, p, pk = d["sac_update"], d["ppo_minibatch"], d["ppo_minibatch_kl_guard"]
    cuda = f"; CUDA sync debug mode: {s['cuda_syncs']}" if d["device"].startswith("cuda") else ""
    return [[f"host syncs, guards off {dev(d)}",
             f"SAC update {s['hot_loop']}{cuda}; PPO minibatch {p['hot_loop_per_minibatch']:.2f} "
             f"({pk['hot_loop_per_minibatch']:.2f} with the KL guard)",
             f"+{s['optimizer_cpu_counters']} optimiser step-counter reads (CPU tensors, no device wait)", "—",
             f"≤ 1 each: {_met(s['hot_loop'] <= 1 and pk['hot_loop_per_minibatch'] <= 1)}"]]


def dispatch_rows(d: dict) -> list[list[str]]:
    """Aten ops dispatched per update (device-independent: counted on the CPU)."""
    sac, ppo = d["sac_update"], d["ppo_minibatch"]
    by_b = lambda counts: ", ".join(f"B {b}: {n}" for b, n in counts.items())  # noqa: E731
    acc, trl = sac["reference_accelerator_plan"], sac["torchrl"]
    flat = len(set(acc.values())) == 1
    worst = max(acc.values()) / max(trl.values())
    return [[rf"aten ops dispatched per SAC update, \|A\| {d['actions']}, Adam(foreach) [cpu count]",
             f"accelerator plan (a GPU's) {by_b(acc)}; CPU plan (row blocks) {by_b(sac['reference_cpu_plan'])}",
             f"TorchRL `DiscreteSACLoss` + Adam {by_b(trl)}", f"**{1 / worst:.2f}**",
             f"≤ TorchRL, flat in B: {_met(flat and worst <= 1)} (flat in B: {_met(flat)})"],
            ["aten ops dispatched per PPO minibatch [cpu count]", f"{ppo['reference']:.0f}",
             f"sb3-contrib `MaskablePPO.train()` {ppo['sb3_contrib']:.0f}",
             f"**{ppo['sb3_contrib'] / ppo['reference']:.2f}**", f"≤ sb3-contrib: {_met(ppo['reference'] <= ppo['sb3_contrib'])}"]]


def trainer_rows(d: dict) -> list[list[str]]:
    """The SAC trainer's steady updates/s, environment steps included (the eager run beside it if there)."""
    eager = _load(f"sac_trainer_{d['device']}_{d['preset']}_eager.json")
    peer = f"the same, eager update: {eager['updates_per_s']:.1f}" if eager else "—"
    ratio = f"{d['updates_per_s'] / eager['updates_per_s']:.2f} (captured / eager)" if eager else "—"
    target = f"≥ 25 updates/s: {_met(d['updates_per_s'] >= 25)}" if d["preset"] == "full" else "—"
    rows = [[f"SAC trainer `--preset {d['preset']}`, learning updates/s {dev(d)}",
             f"{d['updates_per_s']:.1f} updates/s over {d['measured_updates']} updates", peer, ratio, target]]
    compiled = _load(f"sac_trainer_{d['device']}_{d['preset']}_compiled.json")  # --set compile=True, if run
    if compiled:
        rows.append([f"SAC trainer `--preset {d['preset']} --set compile=True`, learning updates/s {dev(compiled)}",
                     f"{compiled['updates_per_s']:.1f} updates/s over {compiled['measured_updates']} updates",
                     f"the same, objectives not compiled: {d['updates_per_s']:.1f}",
                     f"{compiled['updates_per_s'] / d['updates_per_s']:.2f} (compiled / not)", "—"])
    return rows


def busy_rows(d: dict) -> list[list[str]]:
    units = "".join(f", {v:.0f} {k.removesuffix('_per_s')}/s" for k, v in d.items()
                    if k.endswith("_per_s") and k != "updates_per_s")
    return [[f"`rlconform train {d['trainer']}`: share of the wall time the GPU computes {dev(d)}",
             f"{100 * d['busy_fraction']:.0f}% busy; {d['updates_per_s']:.2f} updates/s{units} "
             f"({d['wall_s']:.0f} s run, setup included)", "—", "—", "reported (the host bounds it)"]]


def _classes(side: dict) -> str:
    return f"{1e3 * side['total_s']:.1f} ms: " + ", ".join(f"{c} {1e3 * t:.2f}" for c, t in side["by_class_s"].items()
                                                        if t >= 0.005 * side["total_s"])


def breakdown_rows(d: dict) -> list[list[str]]:
    """Where the SAC update's GPU time goes, and the Top-p plans on the GPU (a CPU file is a smoke run: no row)."""
    if d["device"] == "cpu":
        return []
    ref, trl = d["breakdown"]["reference"], d["breakdown"]["torchrl"]
    rows = [[f"SAC update at V2 scale: kernel time per update by class, eager (the captured update replays these "
             f"kernels) {dev(d)}", _classes(ref), f"TorchRL: {_classes(trl)}",
             f"**{trl['total_s'] / ref['total_s']:.2f}**", "reported (where target 2's time goes)"]]
    comp = d["breakdown"].get("reference_compiled")
    if comp is not None:  # files from before the compiled side hold none
        ours = f"failed: {comp['failed'][:120]}" if "failed" in comp else _classes(comp)
        ratio = "—" if "failed" in comp else f"**{trl['total_s'] / comp['total_s']:.2f}**"
        rows.append([f"the same, fused heads compiled (`compile=True`; Inductor's kernels: \"fused\") {dev(d)}",
                     ours, f"TorchRL: {_classes(trl)}", ratio, "reported (what compiling the heads saves)"])
    tp = d["top_p"]
    captured = all("graph_sorted_over_threshold" in r for r in tp.values())  # else a capture failed: eager times
    suffix, ratio = ("_graph", "graph_sorted_over_threshold") if captured else ("", "sorted_over_threshold")
    times = {plan: ", ".join(f"{k} {1e3 * r['median_s'][plan + suffix]:.2f} ms" for k, r in tp.items())
             for plan in ("threshold", "sorted")}
    ratios = ", ".join(f"{k} {r[ratio]:.2f}" for k, r in tp.items())
    how = "captured" if captured else "eager (the capture failed: see the raw file)"
    rows.append([f"Top-p selection at V2 scale, {how}: radix threshold search vs the sort (the GPU plan) {dev(d)}",
                 f"threshold: {times['threshold']}", f"sort: {times['sorted']}", ratios,
                 "reported (above 1: the GPU should take the threshold search)"])
    return rows


def suite_rows(d: dict) -> list[list[str]]:
    slow = ", ".join(f"{f['file'].removeprefix('test_')} {f['worker_s']:.0f}" for f in d["slowest_files"][:4])
    walls = d.get("wall_s_all", [d["wall_s"]])  # files from before --runs hold one run
    runs = f"median of {len(walls)} runs ({walls[0]:.0f}-{walls[-1]:.0f} s), " if len(walls) > 1 else ""
    ours = (f"{d['wall_s']:.0f} s wall, {runs}{d['tests']} tests, {d['failed']} failed ({d['worker_s']:.0f} "
            f"worker-s; most: {slow})")
    label = f"conformance suite, ci profile, `-n auto` ({d['workers']} workers) [{d['device']}]"
    base = d.get("baseline")
    if base is None:  # files from before --baseline: an absolute target
        return [[label, ours, "—", "—", f"≤ 120 s: {_met(d['wall_s'] <= 120 and not d['failed'])}"]]
    bwalls = base["wall_s_all"]
    theirs = (f"the same command at `{base['commit']}`, run in between: {base['wall_s']:.0f} s wall, median of "
              f"{len(bwalls)} ({bwalls[0]:.0f}-{bwalls[-1]:.0f} s), {base['tests']} tests")
    ratio = d["ratio_to_baseline"]
    return [[label, ours, theirs, f"**{ratio:.2f}** of its time",
             f"≤ 1.20: {_met(ratio <= 1.2 and not d['failed'])}"]]


SOURCES = [("sac_update_{}.json", sac_rows), ("top_p_{}.json", top_p_rows), ("ppo_epoch_{}.json", ppo_rows),
           ("stdb_{}.json", stdb_rows), ("host_syncs_{}.json", sync_rows), ("dispatch_{}.json", dispatch_rows),
           ("suite_time_{}.json", suite_rows), ("sac_trainer_{}_full.json", trainer_rows),
           ("trainer_busy_sac_{}.json", busy_rows), ("trainer_busy_isreshape-lm_{}.json", busy_rows),
           ("sac_breakdown_{}.json", breakdown_rows)]


def _cuda_audit_note() -> str:
    """A line on the reference's own audit on the GPU, where a GPU run left its checklist."""
    p = RAW / "audit_reference_cuda.json"
    if not p.exists():
        return ""
    info = json.loads(p.read_text())["run_info"]
    commit = info.get("tree_commit", info["rlconform_commit"])
    return ("\nThe GPU rows come from the same run as the reference's audit on CUDA (`rlconform audit --device cuda`, "
            f"commit `{commit[:12]}`): [checklist](raw/audit_reference_cuda_checklist.md), "
            "[report](raw/audit_reference_cuda.json). The SAC ratios on the GPU are per synchronised update, as the "
            "trainer runs (it reads its diagnostics after every update)." + _other_audits() + _reruns() + "\n")


def _other_audits() -> str:
    """The CUDA audits of the reference on other cards (``audit_reference_cuda_<card>.json``)."""
    parts = []
    for p in sorted(RAW.glob("audit_reference_cuda_*.json")):
        d = json.loads(p.read_text())
        s, info = d["summary"], d["run_info"]
        parts.append(f"{info.get('device_name', p.stem)}, commit `{info.get('tree_commit', info['rlconform_commit'])[:12]}`: "
                     f"exit {s['exit_code']}, {s['pass']}/{s['clauses']} clauses pass ([report](raw/{p.name}), "
                     f"[checklist](raw/{p.stem}_checklist.md))")
    return (" The same audit on other cards: " + "; ".join(parts) + ".") if parts else ""


def _reruns() -> str:
    """The captured SAC update's ratio in the other GPU runs on file: the spread a single run hides."""
    runs = {p.name: json.loads(p.read_text()) for p in sorted(RAW.glob("sac_update_cuda_rerun*.json"))}
    if not runs:
        return ""

    def card(d):
        return ((d.get("provenance") or {}).get("gpu") or {}).get("name") or "the same kind of card"

    parts = [f"{d['median_s']['torchrl'] / d['median_s']['reference_graph']:.2f} on {card(d)} (captured "
             f"{d['median_s']['reference_graph'] * 1e3:.1f} ms, TorchRL {d['median_s']['torchrl'] * 1e3:.1f} ms; "
             f"[raw](raw/{name}))" for name, d in runs.items()]
    return (" In the other GPU runs on file, TorchRL / captured was " + "; ".join(parts) + ": the captured update "
            "holds its time, TorchRL's varies with the host, so the ratio is read as a range, not one figure.")


def render() -> tuple[str, dict]:
    from rlconform.provenance import render_markdown, stamp

    rows, files = [], []
    for device in ("cpu", "cuda"):
        for pattern, make in SOURCES:
            name = pattern.format(device)
            d = _load(name)
            if d is not None:
                rows += make(d)
                files.append(f"raw/{name}")
    head = "| operation | rlconform | peer | ratio (peer time / rlconform time) | target |\n|---|---|---|---|---|\n"
    table = head + "".join("| " + " | ".join(r) + " |\n" for r in rows)
    facts = stamp(["python", "-m", "tools.benchmarks.report", *sys.argv[1:]],
                  packages=("torchrl", "tensordict", "sb3_contrib", "stable_baselines3", "pytest-benchmark"),
                  extra={"regenerate": "python -m tools.benchmarks.report --run"})
    return ("# Performance\n\n" + render_markdown(facts, data_files=files) + "\n"
            "Measured side by side in one process, contenders interleaved round by round, one torch thread "
            "each, medians of thread CPU time (wall time around a synchronised stream on a GPU); a machine "
            "shared with other jobs slows every contender alike, so the ratios are the figures to read. "
            f"A ratio whose rounds disagree by more than {BUSY_SPREAD:.0%} (each contender's fastest and "
            "slowest round left out) is marked as measured on a busy machine. "
            "Each raw file carries its own provenance (machine, torch version, thread count, date).\n\n"
            + table + _cuda_audit_note() + "\nRegenerate: `python -m tools.benchmarks.report --run [--device cpu|cuda]` "
            "(without `--run`: from the raw JSON already in `docs/performance/raw/`).\n"), facts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="run every benchmark first")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    from tools.benchmarks._common import one_thread

    one_thread()  # the stamp then records the thread count every benchmark ran with
    RAW.mkdir(parents=True, exist_ok=True)
    if args.run:
        run_all(args.device)
    page, facts = render()
    PAGE.write_text(page)
    (PAGE.parent / "provenance.json").write_text(json.dumps(facts, indent=2) + "\n")  # the site's stamp file
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main(sys.argv[1:])
