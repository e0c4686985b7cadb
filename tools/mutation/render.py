"""Render docs/mutation/index.md from tools/mutation/results.json and classification.yaml.

    python tools/mutation/render.py [--check]

Score = detected / (tested - equivalent): detected = killed or timed out by the suite, or a survivor
that a test written for it kills; tested = every mutant with a verdict (untested and skipped ones are
left out and counted apart). A survivor classified "killed" counts as detected only once that is checked:
``run.py --verify-kills`` recorded it in verified.json (the test passes on the original and fails on the
mutant), or a later mutmut run recorded it killed. The same check gives a mutant mutmut left untested (a line
repeated in its module) its verdict: killed by the suite's named test.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS, CLASSIFICATION, VERIFIED = HERE / "results.json", HERE / "classification.yaml", HERE / "verified.json"
WIRING = HERE / "wiring_mutants"  # the hand-written trainer mutants' <family>.results.json (wiring.py)
PAGE = REPO / "docs" / "mutation" / "index.md"
KINDS = ("equivalent", "killed", "open")
TARGET = 0.95


def load_classification(path: Path = CLASSIFICATION) -> list[dict]:
    raw = yaml.safe_load(path.read_text()) if path.exists() else None
    entries = (raw or {}).get("mutants") or []
    for e in entries:
        if e.get("status") not in KINDS:
            raise ValueError(f"{path.name}: {e.get('id')}: status must be one of {KINDS}")
        need = {"equivalent": "reason", "killed": "test", "open": "need"}[e["status"]]
        if not str(e.get(need) or "").strip():
            raise ValueError(f"{path.name}: {e.get('id')}: a {e['status']} mutant needs '{need}'")
    return entries


def _key(module: str, line: str, index: int) -> tuple:
    return module.removeprefix("reference_impl/"), line.strip(), int(index)


def match(results: dict, entries: list[dict]) -> dict[tuple, dict]:
    """Classification entries by (module, source line, index): the line text survives edits that move it."""
    out = {}
    for e in entries:
        module = e["id"].split(":")[0]
        out[_key(module, e["line"], e["id"].rsplit(":", 1)[1])] = e
    return out


def _verified(entry: dict, check: dict | None, mutant: dict) -> bool:
    """--verify-kills saw the claimed test kill this very line (a check of another test, or of a line
    since edited, proves nothing about the claim as it stands)."""
    return bool(check and check.get("killed") and check.get("line") == mutant["line"]
                and check.get("test") == entry["test"])


def summarise(results: dict, entries: list[dict], verified: dict | None = None) -> dict:
    """Per-module counts and the survivors with their classification."""
    by_key = match(results, entries)
    verified = verified or {}
    rows, survivors, claimed = [], [], []
    for module, data in results["modules"].items():
        ms = data.get("mutants") or []
        count = {s: sum(m["status"] == s for m in ms)
                 for s in ("killed", "timeout", "survived", "skipped", "untested", "outside spec")}
        equivalent = open_ = new_kills = 0
        for m in ms:
            e = by_key.get(_key(module, m["line"], m["index"]))
            v = verified.get(e["id"]) if e else None
            if m["status"] == "untested" and e and e["status"] == "killed" and _verified(e, v, m):
                # mutmut 2 gives a line that repeats in a module the other copy's verdict and may never run it;
                # --verify-kills ran this one and the named test of the suite killed it
                count["untested"] -= 1
                count["killed"] += 1
                claimed.append({"module": module, **m, "entry": e})
                continue
            if m["status"] == "survived":
                kind = e["status"] if e else "unclassified"
                if kind == "killed" and _verified(e, v, m):
                    new_kills += 1
                    claimed.append({"module": module, **m, "entry": e})
                    continue
                equivalent += kind == "equivalent"
                open_ += kind in ("open", "unclassified", "killed")
                survivors.append({"module": module, **m, "class": kind if kind != "killed" else "killed (unverified)",
                                  "entry": e})
            elif e and e["status"] == "killed" and m["status"] in ("killed", "timeout"):
                claimed.append({"module": module, **m, "entry": e})
        tested = count["killed"] + count["timeout"] + count["survived"]
        denom = tested - equivalent
        detected = count["killed"] + count["timeout"] + new_kills
        state = "complete" if data.get("state") == "partial" and not count["untested"] else data.get("state", "not run")
        rows.append({"module": module, "state": state, "mutants": len(ms), **count,
                     "equivalent": equivalent, "open": open_, "detected": detected, "new_kills": new_kills,
                     "score": detected / denom if denom else None})
    ran = [r for r in rows if r["mutants"]]
    det, den = sum(r["detected"] for r in ran), sum(r["killed"] + r["timeout"] + r["survived"] - r["equivalent"] for r in ran)
    new_kills = sum(r["new_kills"] for r in ran)
    return {"rows": rows, "survivors": survivors, "killed_by_new_tests": claimed,
            "outside": [{"module": module, **m} for module, data in results["modules"].items()
                        for m in data.get("mutants") or [] if m["status"] == "outside spec"],
            "total": {"detected": det, "non_equivalent": den, "new_kills": new_kills, "score": det / den if den else None,
                      "equivalent": sum(r["equivalent"] for r in ran), "open": sum(r["open"] for r in ran),
                      "untested": sum(r["untested"] for r in ran), "skipped": sum(r["skipped"] for r in ran)}}


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def render_wiring(wiring: dict) -> list[str]:
    """The trainers' hand-written wiring mutants, grouped by trainer (``wiring``: {"updated", "mutants"})."""
    muts = wiring["mutants"]
    killed = sum(m["verdict"] == "killed" for m in muts.values())
    lines = ["", "## The trainers' wiring (hand-written mutants)", "",
             f"mutmut's mutants of a trainer are mostly its help strings; the bugs that ruin a run silently are in "
             f"its data path. These are written by hand, one plausible wiring bug each "
             f"(`tools/mutation/wiring_mutants/`), and run by `tools/mutation/wiring.py` against the trainers' wiring "
             f"tests. **{killed} of {len(muts)} "
             f"killed**; updated {wiring['updated']}.", "",
             "| trainer | mutant | the bug | killed by |", "|---|---|---|---|"]
    for name, m in sorted(muts.items(), key=lambda kv: (kv[1]["file"], kv[0])):
        by = f"`{m['killed_by'].rsplit('::', 1)[-1]}`" if m["verdict"] == "killed" else "**survived**"
        lines.append(f"| `{m['file']}` | `{name}` | {m['bug']} | {by} |")
    return lines


def render(results: dict, summary: dict, stamp_md: str, wiring: dict | None = None) -> str:
    t = summary["total"]
    ran = [r for r in summary["rows"] if r["mutants"]]
    not_run = [r["module"] for r in summary["rows"] if not r["mutants"]]
    partial = [r["module"] for r in ran if r["untested"]]
    lines = [
        "# Mutation testing of the reference",
        "",
        stamp_md,
        f"Tool: **{results['tool']}**, driven by `tools/mutation/run.py` over the reference's math modules and the "
        f"environments its trainers learn in "
        f"(`tools/mutation/config.yaml`); each module is tested only with its own family's test files, "
        f"hypothesis profile `{results.get('profile')}` (the `ci` examples without shrinking), pytest "
        f"`{' '.join(results.get('pytest_args', []))}`. Results updated {results.get('updated')}.",
        "",
        f"**Score: {_pct(t['score'])}** of non-equivalent mutants detected ({t['detected']} of {t['non_equivalent']}), "
        f"target {_pct(TARGET)}. {t['new_kills']} of the detected survived the suite and are killed by tests written for "
        f"them (checked by `run.py --verify-kills`). {t['equivalent']} survivors are equivalent mutants (no input can tell them apart; "
        f"each with its reason below), {t['open']} are open. {t['skipped']} mutants on error-message lines were not "
        f"run (tools/mutation/mutmut_config.py; a dict entry that opens with its string key is code, and runs) "
        f"and {t['untested']} were not reached before the run stopped.",
        "",
        "| module | state | mutants run | killed by the suite | timeout | survived | killed by new tests | equivalent | open | untested | score |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ran:
        lines.append(f"| `{r['module']}` | {r['state']} | {r['mutants'] - r['skipped']} | {r['killed']} | {r['timeout']} | "
                     f"{r['survived']} | {r['new_kills']} | {r['equivalent']} | {r['open']} | {r['untested']} | {_pct(r['score'])} |")
    lines += ["", "Modules in the configuration that this run did not reach (no verdict, not in the score): "
              + (", ".join(f"`{m}`" for m in not_run) if not_run else "none") + "."]
    if partial:
        lines += ["", "Modules stopped part-way (the score covers only their tested mutants): "
                  + ", ".join(f"`{m}`" for m in partial) + "."]
    lines += ["", "## Surviving mutants", ""]
    if not summary["survivors"]:
        lines.append("None.")
    else:
        lines += ["| mutant | change | class | why / what a test needs |", "|---|---|---|---|"]
        for s in summary["survivors"]:
            e = s["entry"] or {}
            why = e.get("reason") or e.get("need") or (f"killed by `{e['test']}` (awaiting a re-run)" if e.get("test") else "not classified yet")
            change = s.get("diff") or s["line"]
            lines.append(f"| `{s['id']}` | {_code(change.replace(chr(10), ' → '))} | {s['class']} | {why} |")
    if summary["killed_by_new_tests"]:
        lines += ["", "## Survivors killed by tests written for them", "",
                  "Each passes on the original module and fails on the mutant (`run.py --verify-kills`, verified.json).", "",
                  "| mutant | change | killed by |", "|---|---|---|"]
        for s in summary["killed_by_new_tests"]:
            change = (s.get("diff") or s["line"]).replace(chr(10), " → ")
            lines.append(f"| `{s['id']}` | {_code(change)} | `{s['entry']['test']}` |")
    if summary["outside"]:
        reasons = sorted({m["outside_spec"] for m in summary["outside"]})
        lines += ["", "## Outside the specification", "",
                  f"{len(summary['outside'])} mutants fall in functions that implement no clause; they are not scored "
                  "(tools/mutation/config.yaml, `outside_spec`):", ""] + [f"- `{r.split(':', 1)[0]}`:{r.split(':', 1)[1]}" for r in reasons]
    if wiring:
        lines += render_wiring(wiring)
    lines += ["", "## Reproduce", "", "```bash",
              "pip install 'mutmut==2.5.1' 'torch==2.13.0'",
              "nice -n 19 python tools/mutation/run.py --until 18:00   # resumable: run again to continue",
              "python tools/mutation/run.py --verify-kills             # survivors that new tests kill",
              "python tools/mutation/wiring.py                        # the trainers' wiring mutants",
              "python tools/mutation/render.py                        # this page", "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the score is below the target")
    args = ap.parse_args(argv)
    results = json.loads(RESULTS.read_text())
    verified = json.loads(VERIFIED.read_text()) if VERIFIED.exists() else {}
    summary = summarise(results, load_classification(), verified)
    from rlconform.provenance import render_markdown, stamp

    facts = stamp("python tools/mutation/render.py", packages=["mutmut"],
                  extra={"results_updated": results.get("updated")})
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(RESULTS, PAGE.parent / "results.json")
    wiring, data = None, ["results.json"]
    for path in sorted(WIRING.glob("*.results.json")):
        family = json.loads(path.read_text())
        wiring = wiring or {"updated": family["updated"], "mutants": {}}
        wiring["updated"] = max(wiring["updated"], family["updated"])
        wiring["mutants"].update(family["mutants"])
        shutil.copy2(path, PAGE.parent / f"wiring-{path.name}")
        data.append(f"wiring-{path.name}")
    PAGE.write_text(render(results, summary, render_markdown(facts, data_files=data), wiring))
    if (facts.get("commit") or "").endswith("+dirty"):  # a run's export or a new test not committed yet
        print(f"warning: uncommitted changes ({', '.join(facts.get('modified', []))}): the site build refuses this "
              "stamp; commit them, then render again", file=sys.stderr)
    t = summary["total"]
    print(f"wrote {PAGE.relative_to(REPO)}: score {_pct(t['score'])} ({t['detected']}/{t['non_equivalent']}), "
          f"{t['open']} open, {t['equivalent']} equivalent")
    return 1 if args.check and (t["score"] is None or t["score"] < TARGET) else 0


if __name__ == "__main__":
    sys.exit(main())
