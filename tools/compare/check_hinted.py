#!/usr/bin/env python3
"""Checks remat-compare reports: at every budget, `hinted` fits wherever any static plan or
dynamic policy fits, at or below the lowest overhead among them (issue 6's first point).

    tools/compare/check_hinted.py out/resnet18.json out/unet.json ...

Prints one line per budget and exits 1 if any budget misses. Files that are not reports
(the memory timelines beside them, `*.trace.json`) are skipped, so `DIR/*.json` works.
"""
import json
import sys


def check(path):
    if path.endswith(".trace.json"):
        return 0
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as e:
        sys.exit(f"check_hinted.py: {path}: {e}")
    if not isinstance(report, dict) or "runs" not in report:
        print(f"skipping {path}: not a remat-compare report", file=sys.stderr)
        return 0
    by_fraction = {}
    for run in report["runs"]:
        by_fraction.setdefault(run["fraction"], []).append(run)
    misses = 0
    for fraction in sorted(by_fraction, reverse=True):
        runs = by_fraction[fraction]
        hinted = [r for r in runs if r["kind"] == "hinted"][0]
        others = [r for r in runs if r["kind"] in ("static", "dynamic") and r["status"] == "ok"]
        best = min(others, key=lambda r: r["overhead"]) if others else None
        if best is None:
            verdict = "ok (nothing else fits)"
        elif hinted["status"] == "ok" and hinted["overhead"] <= best["overhead"] + 1e-9:
            verdict = "ok"
        else:
            verdict = "MISS"
            misses += 1
        got = f"{hinted['overhead']:.4f}" if hinted["status"] == "ok" else hinted["status"]
        want = f"{best['overhead']:.4f} ({best['method']})" if best else "-"
        print(f"{report['graph']:<16} {fraction:.2f}  hinted {got:<8} best other {want:<22} {verdict}")
    return misses


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    sys.exit(1 if sum(check(p) for p in sys.argv[1:]) else 0)
