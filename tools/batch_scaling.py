#!/usr/bin/env python3
"""Larger batches in the memory of a smaller one: per-sample step time against unconstrained.

    python3 tools/batch_scaling.py [--trainer build/bin/gpt_train] [--batch B] [--factors 2,4]
                                   [--steps N] [--limit 1.3] [--json] -- [trainer flags...]

Runs the trainer unconstrained at batch B (its baseline), takes that run's peak reserved bytes
as the budget, and runs batches B x factor under that budget. For each it reports the time per
sample of a warm step (the median of the second half of the steps) against the unconstrained
batch's, and fails (exit 1) when the first factor's ratio is
above --limit (issue 5: the largest batch that fits, and twice it under the same memory at no
more than 1.3x the per-sample time). Flags after `--` go to every trainer run (--backend cuda,
model sizes). tools/gpu_check.sh runs it on the GPU with the largest batch that fits.
"""
import argparse
import json
import subprocess
import sys


def steady_seconds(result):
    """A step's time once warm: the median of the second half of the steps' times (the first
    steps start the context and cuBLAS, reserve memory and, under `auto`, record and plan)."""
    times = result.get("step_seconds") or [result["wall_seconds"]]
    late = sorted(times[len(times) // 2:])
    return late[len(late) // 2]


def train(trainer, batch, extra, steps, budget=None):
    cmd = [trainer, "--json", "--steps", str(steps), "--batch", str(batch)] + extra
    if budget is not None:
        cmd += ["--budget", str(budget), "--baseline", "no"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"batch_scaling: {' '.join(cmd)} printed no JSON (exit {out.returncode})"
                         f"\n{out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", default="build/bin/gpt_train")
    ap.add_argument("--batch", type=int, default=4, help="the unconstrained batch")
    ap.add_argument("--factors", default="2,4", help="larger batches, as multiples of --batch")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--limit", type=float, default=1.3)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)

    base = train(a.trainer, a.batch, extra, a.steps)
    if base.get("status") != "ok":
        raise SystemExit(f"batch_scaling: the unconstrained batch {a.batch} failed: {base}")
    budget = base["peak_reserved_bytes"]
    per_sample = steady_seconds(base) / a.batch
    rows = [{"batch": a.batch, "budget_bytes": None, "status": "ok",
             "peak_reserved_bytes": budget, "per_sample_seconds": per_sample, "ratio": 1.0}]
    for f in [int(x) for x in a.factors.split(",") if x]:
        r = train(a.trainer, a.batch * f, extra, a.steps, budget)
        row = {"batch": a.batch * f, "budget_bytes": budget, "status": r.get("status"),
               "peak_reserved_bytes": r.get("peak_reserved_bytes"),
               "evictions": r.get("evictions"), "compute_overhead": r.get("compute_overhead")}
        if r.get("status") == "ok":
            row["per_sample_seconds"] = steady_seconds(r) / (a.batch * f)
            row["ratio"] = row["per_sample_seconds"] / per_sample
        rows.append(row)
    first = rows[1] if len(rows) > 1 else None
    ok = first is not None and first.get("ratio") is not None and first["ratio"] <= a.limit
    result = {"trainer": a.trainer, "flags": extra, "steps": a.steps, "limit": a.limit,
              "ok": ok, "rows": rows}
    if a.json:
        print(json.dumps(result))
    else:
        for r in rows:
            ratio = f"{r['ratio']:.3f}x" if r.get("ratio") is not None else r["status"]
            budget = "none" if r["budget_bytes"] is None else f"{r['budget_bytes']} B"
            print(f"batch {r['batch']:4d}  budget {budget:>14}  per-sample "
                  f"{r.get('per_sample_seconds', float('nan')) * 1e3:9.3f} ms  {ratio}")
        print(f"batch_scaling: {'ok' if ok else 'FAILED'} (limit {a.limit}x for the first factor)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
