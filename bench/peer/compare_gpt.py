#!/usr/bin/env python3
"""remat against the same GPT in PyTorch, interleaved, on this machine.

    python3 bench/peer/compare_gpt.py [--size small|big] [--repeats 3] [--steps 6]
        [--trainer build/bin/gpt_train] [--compile-budgets 0.5,0.1] [--out docs/peer]
        [--attention math|sdpa] [--host-memory MIB] [--json]

Runs, for one model size, each configuration `--repeats` times in turn (A B A B ...), on
2 threads (OpenBLAS for remat; torch.set_num_threads and OMP_WAIT_POLICY=PASSIVE for
PyTorch, as its users would tune it), and reports medians and spreads of the step time
(first step excluded; gpt_train's first three: see WARMUP) with each run's peak memory:
  - PyTorch (the current release: bench/peer/gpt_torch.py) and gpt_train unconstrained;
  - PyTorch with torch.utils.checkpoint on every block and on every 2 blocks, and gpt_train
    (its default policy, auto, and DTR alone) with a budget of the bytes each of those
    peaked at (PyTorch's peak live tensor bytes, which is what remat's budget caps);
  - gpt_train alone at 0.95, 0.9 and 0.8 of checkpointing every block's peak;
  - PyTorch compiled by torch.compile at each --compile-budgets activation_memory_budget,
    and the PyTorch program itself on remat's device (remat_torch, from build/python) at the
    peak each reached;
  - remat_torch unconstrained, at checkpointing every block's peak, and at 0.9 and 0.8 of it
    (under a budget with policy auto, its steps marked: docs/pytorch.md); with --host-memory,
    those three again with the optimizer's state waiting on the host during each step.
Writes NAME.json, NAME.md (the table) and NAME.svg (step time against peak memory) under
--out. Warns where the machine is not quiet (load average over 0.5 before a run). Needs torch
(bash tools/setup.sh); without it, says so and exits 3.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

SIZES = {
    "small": dict(layers=4, channels=128, heads=4, vocab=256, batch=8, t=256),
    "big": dict(layers=6, channels=384, heads=6, vocab=256, batch=8, t=256),
}
HERE = os.path.dirname(os.path.abspath(__file__))
# Where the build puts the Python module remat_torch.
PYTHON_BUILD = os.path.join(HERE, "..", "..", "build", "python")


def torch_python():
    """A Python that has torch: this one, or another named by REMAT_TORCH_PYTHON."""
    for py in (os.environ.get("REMAT_TORCH_PYTHON"), sys.executable, "/usr/bin/python3"):
        if py and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
            return py
    raise SystemExit("compare_gpt: no Python here has torch (bash tools/setup.sh)")


def quiet_check():
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"compare_gpt: warning: load average {load:.2f}: timings are noisy",
              file=sys.stderr)
    return load


ATTENTION = "math"  # --attention


def run_torch(size, steps, checkpoint="none", compile_budget=None, remat_budget=None,
              remat=False, host_memory=0):
    """gpt_torch.py: plain, checkpointed, compiled, or on remat's device (remat_torch)."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_BUILD, env.get("PYTHONPATH")) if p)
    cmd = [torch_python(), os.path.join(HERE, "gpt_torch.py"), "--json", "--steps", str(steps),
           "--checkpoint", checkpoint, "--threads", "2", "--attention", ATTENTION]
    for k, v in size.items():
        cmd += [f"--{k}", str(v)]
    if compile_budget is not None:
        cmd += ["--compile-budget", str(compile_budget)]
    if remat:  # under a budget, policy auto: the marked steps planned (docs/pytorch.md)
        cmd += ["--device", "remat"] + ([] if remat_budget is None else
                                        ["--budget", str(int(remat_budget)), "--policy", "auto"])
        cmd += ["--host-memory", str(host_memory)] if host_memory else []
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode == 3:
        raise SystemExit(out.stderr.strip() or "compare_gpt: torch is not installed")
    if out.returncode != 0:
        if remat and "out of memory" in out.stderr:
            return {"step": None, "peak": remat_budget, "ok": False, "status": "out of memory"}
        raise SystemExit(f"compare_gpt: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.splitlines()[-1])
    row = {"step": r["step_seconds_median"], "peak": r["peak_live_bytes"], "ok": True}
    if remat:
        row.update(status="ok", overhead=r.get("compute_overhead"))
        plan = r.get("plan") or {}
        if plan.get("phase") in ("plan", "dtr"):
            row["plan"] = plan["source"] if plan["phase"] == "plan" else "dtr"
    return row


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
    steps = [r["step"] for r in runs if r["ok"] and r["step"] is not None]
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


def nice_ticks(hi):
    """Round ticks from 0 to past `hi`: steps of 1, 2 or 5 times a power of ten."""
    raw = hi / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag)
    n = math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def log_ticks(lo, hi):
    """Round ticks (1, 2 and 5 times powers of ten) spanning [lo, hi] on a log axis."""
    ticks, mag = [], 10 ** math.floor(math.log10(lo))
    while not ticks or ticks[-1] < hi:
        for m in (1, 2, 5):
            if m * mag >= lo / 2 and (not ticks or ticks[-1] < hi):
                ticks.append(round(m * mag, 10))
        mag *= 10
    while len(ticks) > 1 and ticks[1] <= lo:
        ticks.pop(0)
    return ticks


STYLES = {  # system: (legend name, colour, marker)
    "pytorch": ("PyTorch (eager)", "#d62728", "circle"),
    "compile": ("PyTorch torch.compile", "#ff7f0e", "square"),
    "remat": ("remat gpt_train (C++)", "#1f77b4", "circle"),
    "remat_torch": ("remat_torch (the PyTorch program on remat's device)", "#2ca02c", "triangle"),
}


def system_of(config):
    for prefix in ("remat_torch", "remat", "pytorch compile", "pytorch"):
        if config.startswith(prefix):
            return {"pytorch compile": "compile"}.get(prefix, prefix)
    return "pytorch"


def marker(kind, cx, cy, colour):
    if kind == "square":
        return f'<rect x="{cx - 5:.1f}" y="{cy - 5:.1f}" width="10" height="10" fill="{colour}"/>'
    if kind == "triangle":
        return (f'<polygon points="{cx:.1f},{cy - 6:.1f} {cx - 6:.1f},{cy + 5:.1f} '
                f'{cx + 6:.1f},{cy + 5:.1f}" fill="{colour}"/>')
    return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colour}"/>'


def place_label(cx, cy, text, taken):
    """A spot for a point's number beside it that overlaps no marker and no label placed
    before (nearest spots first, then farther ones)."""
    w, h = 7 * len(text), 11
    spots = [(dx, dy) for r in (7, 16, 26)
             for dx, dy in ((r, -r + 2), (r, r + 9), (-r - w, -r + 2), (-r - w, r + 9),
                            (r, 4), (-r - w, 4), (-w / 2, -r), (-w / 2, r + 11))]
    for dx, dy in spots:
        box = (cx + dx, cy + dy - h, cx + dx + w, cy + dy)
        if all(box[2] < o[0] or box[0] > o[2] or box[3] < o[1] or box[1] > o[3] for o in taken):
            taken.append(box)
            return box[0], box[3]
    taken.append((cx + 7, cy - 7 - h, cx + 7 + w, cy - 7))
    return cx + 7, cy - 7


def svg(rows, path, title):
    """Step time against peak memory: titled, round ticks, each point numbered, and a legend
    that says which points are remat and which PyTorch and what each number is."""
    pts = [(r["peak_bytes"] / 2**20, r["step_median"], r["config"]) for r in rows
           if r.get("step_median") is not None and r.get("peak_bytes")]
    if not pts:
        return
    xt = nice_ticks(max(p[0] for p in pts))
    steps = [p[1] for p in pts]
    # Step times a few times apart (a slow run beside the rest) read better on a log axis.
    log_y = max(steps) > 4 * min(steps)
    yt = log_ticks(min(steps), max(steps)) if log_y else nice_ticks(max(steps))
    plot_w, plot_h, left, top = 520, 360, 70, 50
    legend_x = left + plot_w + 30
    w, h = legend_x + 420, max(top + plot_h + 60, top + 20 + 16 * (len(pts) + 6))
    x = lambda v: left + plot_w * v / xt[-1]
    if log_y:
        span = math.log10(yt[-1] / yt[0])
        y = lambda v: top + plot_h - plot_h * math.log10(v / yt[0]) / span
    else:
        y = lambda v: top + plot_h - plot_h * v / yt[-1]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif">', f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="15">{title}</text>']
    for v in xt:
        parts.append(f'<line x1="{x(v):.1f}" y1="{top}" x2="{x(v):.1f}" y2="{top + plot_h}" '
                     f'stroke="#eee"/>')
        parts.append(f'<text x="{x(v):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                     f'font-size="11">{v:g}</text>')
    for v in yt:
        parts.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}" '
                     f'stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" '
                     f'font-size="11">{v:g}</text>')
    parts += [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
              f'stroke="black"/>',
              f'<text x="{left + plot_w / 2}" y="{top + plot_h + 40}" text-anchor="middle" '
              f'font-size="12">peak memory (MiB): PyTorch\'s live tensor bytes, remat\'s reserved '
              f'bytes</text>',
              f'<text x="18" y="{top + plot_h / 2}" transform="rotate(-90 18 {top + plot_h / 2})" '
              f'text-anchor="middle" font-size="12">step time (s), median'
              f'{", log scale" if log_y else ""}</text>']
    taken = [(x(px) - 6, y(py) - 6, x(px) + 6, y(py) + 6) for px, py, _ in pts]
    for i, (px, py, name) in enumerate(pts, 1):
        _, colour, kind = STYLES[system_of(name)]
        parts.append(marker(kind, x(px), y(py), colour))
        lx, ly = place_label(x(px), y(py), str(i), taken)
        parts.append(f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="11">{i}</text>')
    ly = top + 10
    for system in sorted({system_of(p[2]) for p in pts}, key=list(STYLES).index):
        label, colour, kind = STYLES[system]
        parts.append(marker(kind, legend_x + 6, ly - 4, colour))
        parts.append(f'<text x="{legend_x + 18}" y="{ly}" font-size="12">{label}</text>')
        ly += 18
    ly += 8
    for i, (px, py, name) in enumerate(pts, 1):
        parts.append(f'<text x="{legend_x}" y="{ly}" font-size="11">{i}  {name}</text>')
        ly += 16
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def run_remat_torch(configs, size, a, checkpoint_peak):
    """The PyTorch program itself on remat's device: unconstrained, at checkpointing every
    block's peak and below it, beside torch.compile at each activation_memory_budget and
    remat_torch at the peak that reached."""
    if a.compile_budgets:
        for b in [float(v) for v in a.compile_budgets.split(",")]:
            name = f"pytorch compile budget {b}"
            configs[name] = [run_torch(size, a.steps, compile_budget=b)
                             for _ in range(a.repeats)]
            rname = f"remat_torch at compile-{b} peak"
            configs[rname] = [run_torch(size, a.steps, remat=True,
                                        remat_budget=configs[name][-1]["peak"])
                              for _ in range(a.repeats)]
    configs["remat_torch"] = [run_torch(size, a.steps, remat=True) for _ in range(a.repeats)]
    for f in (1.0, 0.9, 0.8):
        name = ("remat_torch at checkpoint-every peak" if f == 1.0 else
                f"remat_torch at {f} of checkpoint-every peak")
        configs[name] = [run_torch(size, a.steps, remat=True, remat_budget=f * checkpoint_peak)
                         for _ in range(a.repeats)]
        if a.host_memory:  # the optimizer's state waits on the host (docs/pytorch.md)
            configs[name + ", state on the host"] = [
                run_torch(size, a.steps, remat=True, remat_budget=f * checkpoint_peak,
                          host_memory=a.host_memory) for _ in range(a.repeats)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--trainer", default="build/bin/gpt_train")
    ap.add_argument("--out", default="docs/peer")
    ap.add_argument("--compile-budgets", default="0.5,0.1",
                    help="torch.compile activation_memory_budget values ('' for none)")
    ap.add_argument("--attention", choices=["math", "sdpa"], default="math",
                    help="the PyTorch model's attention (gpt_torch.py --attention); sdpa "
                    "writes gpt_SIZE_sdpa.*")
    ap.add_argument("--host-memory", type=int, default=0, metavar="MIB",
                    help="also run remat_torch at checkpointing's peak and below with this "
                    "much host memory for the optimizer's state (remat_torch.set_host_memory)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    global ATTENTION
    ATTENTION = a.attention
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
    run_remat_torch(configs, size, a, ck["every"])
    rows = [summarize(n, r) for n, r in configs.items()]
    base = {r["config"]: r.get("step_median") for r in rows}
    for r in rows:
        own = {"remat": base["remat"], "remat_torch": base.get("remat_torch")}.get(
            system_of(r["config"]), base["pytorch"])
        if r.get("step_median") and own:
            r["vs_own_unconstrained"] = r["step_median"] / own
        if r.get("step_median") and base["pytorch"]:
            r["vs_pytorch_unconstrained"] = r["step_median"] / base["pytorch"]
    result = {"size": a.size, "model": size, "attention": a.attention, "repeats": a.repeats,
              "steps": a.steps,
              "max_load_average": max(loads), "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"gpt_{a.size}" + ("_sdpa" if a.attention == "sdpa" else ""))
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
    svg(rows, stem + ".svg",
        f"GPT {a.size} ({size['layers']} layers, {size['channels']} channels, T {size['t']}, "
        f"batch {size['batch']}, {a.attention} attention): step time against peak memory, "
        "2 threads")
    print(json.dumps(result) if a.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
