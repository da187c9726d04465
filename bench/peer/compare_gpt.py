#!/usr/bin/env python3
"""remat's gpt_train against the same GPT in PyTorch, interleaved, on this machine.

    python3 bench/peer/compare_gpt.py [--size small|big] [--repeats 3] [--steps 6]
        [--trainer build/bin/gpt_train] [--out docs/peer] [--json]

Runs, for one model size, each configuration `--repeats` times in turn (A B A B ...), on
2 threads (OpenBLAS for remat; torch.set_num_threads and OMP_WAIT_POLICY=PASSIVE for
PyTorch, as its users would tune it), and reports medians and spreads of the step time
(first step excluded; remat's first three: see WARMUP) with each run's peak memory:
  - both unconstrained;
  - PyTorch with torch.utils.checkpoint on every block and on every 2 blocks, and remat
    (its default policy, auto, and DTR alone) with a budget of the bytes each of those peaked at (PyTorch's peak live tensor bytes,
    which is what remat's budget caps, plus nothing: remat's allocator must fit it);
  - remat alone at 0.95, 0.9 and 0.8 of checkpointing every block's peak.
Writes NAME.json, NAME.md (the table) and NAME.svg (step time against peak memory) under
--out. Warns where the machine is not quiet (load average over 0.5 before a run). Needs
python3-torch; without it, says so and exits 3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

SIZES = {
    "small": dict(layers=4, channels=128, heads=4, vocab=256, batch=8, t=256),
    "big": dict(layers=6, channels=384, heads=6, vocab=256, batch=8, t=256),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def torch_python():
    """A Python that has torch: this one, or Debian's (python3-torch installs there)."""
    for py in (os.environ.get("REMAT_TORCH_PYTHON"), sys.executable, "/usr/bin/python3"):
        if py and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    raise SystemExit("compare_gpt: no Python here has torch (apt install python3-torch)")


def quiet_check():
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"compare_gpt: warning: load average {load:.2f}: timings are noisy",
              file=sys.stderr)
    return load


def run_torch(size, steps, checkpoint):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="2")
    cmd = [torch_python(), os.path.join(HERE, "gpt_torch.py"), "--json", "--steps", str(steps),
           "--checkpoint", checkpoint, "--threads", "2"]
    for k, v in size.items():
        cmd += [f"--{k}", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode == 3:
        raise SystemExit(out.stderr.strip() or "compare_gpt: python3-torch is not installed")
    if out.returncode != 0:
        raise SystemExit(f"compare_gpt: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.splitlines()[-1])
    return {"step": r["step_seconds_median"], "peak": r["peak_live_bytes"], "ok": True}


# Steps before remat's timed ones: the first, then under a budget the two more that policy
# auto runs before its plan (DTR, DTR recorded, then planned, screened and tried: see
# Note [Planning repeated shapes]); the planning time is reported apart.
WARMUP = 3


def run_remat(trainer, size, steps, budget=None, fraction=None, policy=None):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2")
    cmd = [trainer, "--json", "--steps", str(steps + WARMUP), "--layers", str(size["layers"]),
           "--channels", str(size["channels"]), "--heads", str(size["heads"]),
           "--vocab", str(size["vocab"]), "--batch", str(size["batch"]),
           "--min-t", str(size["t"]), "--max-t", str(size["t"])]
    if budget is not None:
        cmd += ["--budget", str(budget), "--baseline", "no"]
    elif fraction is not None:
        cmd += ["--budget-fraction", str(fraction)]
    else:
        cmd += ["--baseline", "no"]
    if policy:
        cmd += ["--policy", policy]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"compare_gpt: {' '.join(cmd)} printed no JSON:\n{out.stderr[-2000:]}")
    r = json.loads(lines[-1])
    times = r.get("step_seconds", [])[WARMUP:]
    plans = r.get("shape_plans") or []
    plan = "; ".join(f"{p.get('decision')}: {p.get('plan', '')} "
                     f"({p.get('plan_seconds', 0):.1f} s to plan)" for p in plans)
    return {"step": statistics.median(times) if times else float("nan"), "plan": plan,
            "peak": r.get("peak_reserved_bytes"), "allocated": r.get("peak_allocated_bytes"),
            "ok": r.get("status") == "ok", "status": r.get("status"),
            "overhead": r.get("compute_overhead"),
            "match": r.get("losses_match_baseline")}


def summarize(name, runs):
    steps = [r["step"] for r in runs if r["ok"]]
    row = {"config": name, "runs": len(runs), "ok": all(r["ok"] for r in runs),
           "peak_bytes": runs[-1]["peak"]}
    if steps:
        row.update(step_median=statistics.median(steps), step_min=min(steps),
                   step_max=max(steps))
    if "status" in runs[-1]:
        row["status"] = runs[-1]["status"]
        row["compute_overhead"] = runs[-1].get("overhead")
        row["plan"] = runs[-1].get("plan", "")
    return row


def svg(rows, path):
    pts = [(r["peak_bytes"] / 2**20, r["step_median"], r["config"]) for r in rows
           if r.get("step_median") is not None and r.get("peak_bytes")]
    if not pts:
        return
    w, h, m = 640, 400, 60
    xmax = max(p[0] for p in pts) * 1.1
    ymax = max(p[1] for p in pts) * 1.2
    x = lambda v: m + (w - 2 * m) * v / xmax
    y = lambda v: h - m - (h - 2 * m) * v / ymax
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">peak memory (MiB)</text>',
             f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" '
             f'text-anchor="middle">step time (s)</text>']
    for i in range(5):
        xv, yv = xmax * i / 4, ymax * i / 4
        parts.append(f'<text x="{x(xv)}" y="{h - m + 18}" text-anchor="middle" '
                     f'font-size="11">{xv:.0f}</text>')
        parts.append(f'<text x="{m - 6}" y="{y(yv) + 4}" text-anchor="end" '
                     f'font-size="11">{yv:.2f}</text>')
    for px, py, name in pts:
        color = "#1f77b4" if name.startswith("remat") else "#d62728"
        parts.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="5" fill="{color}"/>')
        parts.append(f'<text x="{x(px) + 7:.1f}" y="{y(py) - 7:.1f}" font-size="10">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--trainer", default="build/bin/gpt_train")
    ap.add_argument("--out", default="docs/peer")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    size = SIZES[a.size]
    loads = []
    # PyTorch's checkpointed peaks set remat's budgets, so they run first.
    configs = {"pytorch": [], "remat": []}
    for _ in range(a.repeats):
        loads.append(quiet_check())
        configs["pytorch"].append(run_torch(size, a.steps, "none"))
        configs["remat"].append(run_remat(a.trainer, size, a.steps))
    ck = {}
    for mode in ("every", "every2"):
        name = f"pytorch checkpoint {mode}"
        configs[name] = []
        for _ in range(a.repeats):
            loads.append(quiet_check())
            configs[name].append(run_torch(size, a.steps, mode))
        ck[mode] = configs[name][-1]["peak"]
        rname = f"remat at checkpoint-{mode} peak"
        configs[rname] = []
        configs[rname + " (dtr)"] = []
        for _ in range(a.repeats):
            configs[rname].append(run_remat(a.trainer, size, a.steps, budget=ck[mode]))
            configs[rname + " (dtr)"].append(
                run_remat(a.trainer, size, a.steps, budget=ck[mode], policy="dtr"))
    # Below checkpointing: what remat reaches at less memory than checkpointing every block.
    for f in (0.95, 0.9, 0.8):
        name = f"remat at {f} of checkpoint-every peak"
        configs[name] = [run_remat(a.trainer, size, a.steps, budget=int(f * ck["every"]))
                         for _ in range(a.repeats)]
    rows = [summarize(n, r) for n, r in configs.items()]
    base = {r["config"]: r.get("step_median") for r in rows}
    for r in rows:
        own = base["pytorch"] if r["config"].startswith("pytorch") else base["remat"]
        if r.get("step_median") and own:
            r["vs_own_unconstrained"] = r["step_median"] / own
        if r.get("step_median") and base["pytorch"]:
            r["vs_pytorch_unconstrained"] = r["step_median"] / base["pytorch"]
    result = {"size": a.size, "model": size, "repeats": a.repeats, "steps": a.steps,
              "max_load_average": max(loads), "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"gpt_{a.size}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = ["| configuration | peak (MiB) | step (s), median [min, max] | x own unconstrained "
             "| x PyTorch unconstrained | status | remat's plan |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        peak = f"{r['peak_bytes'] / 2**20:.1f}" if r.get("peak_bytes") else "-"
        st = (f"{r['step_median']:.3f} [{r['step_min']:.3f}, {r['step_max']:.3f}]"
              if r.get("step_median") is not None else "-")
        lines.append(f"| {r['config']} | {peak} | {st} | {r.get('vs_own_unconstrained', 0):.2f} "
                     f"| {r.get('vs_pytorch_unconstrained', 0):.2f} | {r.get('status', 'ok')} "
                     f"| {r.get('plan') or '-'} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    svg(rows, stem + ".svg")
    print(json.dumps(result) if a.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
