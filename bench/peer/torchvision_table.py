#!/usr/bin/env python3
"""torchvision's classifiers on remat's PyTorch device: which train bit for bit like the CPU,
unconstrained and under a budget, and why the rest do not.

    PYTHONPATH=build/python python3 bench/peer/torchvision_table.py [--models a,b,...]
        [--fraction 0.5] [--steps 2] [--batch 4] [--size 64] [--timeout 600] [--json]

Each model runs in a process of its own (bench/peer/torch_budgets.py --json): 10 classes,
--batch random images of --size pixels, SGD with momentum, --steps steps on the CPU, on the
device unconstrained and at --fraction of its activation bytes (above the parameters,
gradients and momentum). Prints a Markdown table, a row a model, and the share that trained
bitwise under the budget.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

# The classifiers small enough to train on two cores in a minute or so each.
DEFAULT_MODELS = [
    "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
    "googlenet", "mnasnet1_0", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
    "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnet34", "resnet50",
    "resnext50_32x4d", "shufflenet_v2_x1_0", "squeezenet1_1", "swin_t", "vgg11_bn",
    "vit_b_32", "wide_resnet50_2",
]


def run_model(name, a):
    script = pathlib.Path(__file__).resolve().parent / "torch_budgets.py"
    cmd = [sys.executable, str(script), "--model", name, "--json", "--steps", str(a.steps),
           "--fractions", str(a.fraction), "--batch", str(a.batch), "--size", str(a.size)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "error": f"took over {a.timeout} s"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "error": f"exit {out.returncode}: {tail}"}
    return json.loads(lines[-1])


def first_line(text, width=140):
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[:width - 3] + "..."


def why_out_of_memory(error):
    """What an out-of-memory error's figures show: the pinned bytes (parameters, gradients,
    optimizer state and the optimizer's temporaries) with the request above the budget, or
    the operator's own needs (its locked inputs and kernel scratch) with them, or neither
    (fragmentation)."""
    m = re.search(r"requested (\d+) bytes under a budget of (\d+) bytes", error)
    parts = dict(re.findall(r"(pinned|locked by running ops|kernel scratch and workspace) (\d+)",
                            error))
    if not m or "pinned" not in parts:
        return first_line(error)
    request, budget = int(m.group(1)), int(m.group(2))
    pinned = int(parts["pinned"])
    own = int(parts.get("locked by running ops", 0)) + int(parts.get("kernel scratch and workspace", 0))
    mb = lambda b: f"{b / 1e6:.1f}"
    op = re.search(r"in op '([^']+)'", error)
    where = f"in {op.group(1)}: " if op else ""
    if pinned + request > budget:
        return f"{where}pinned {mb(pinned)} + request {mb(request)} MB > budget {mb(budget)}"
    if pinned + own + request > budget:
        return (f"{where}pinned {mb(pinned)} + operator's own {mb(own)} + request {mb(request)} "
                f"MB > budget {mb(budget)}")
    return f"{where}fragmented: " + first_line(error, 80)


def row_of(r):
    """(unconstrained, budgeted, overhead, reason) of one model's result."""
    if "rows" not in r:
        return "fails", "-", "-", first_line(r["error"])
    free, budgeted = r["rows"][0], r["rows"][1]
    unconstrained = "bitwise" if free["bitwise"] else "differs"
    if not budgeted["fits"]:
        return unconstrained, "out of memory", "-", why_out_of_memory(budgeted["error"])
    verdict = "bitwise" if budgeted["bitwise"] else "differs"
    return unconstrained, verdict, f"{budgeted['compute_overhead']:.2f}", ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=600, help="seconds a model may take")
    ap.add_argument("--json", action="store_true", help="one JSON object a model instead")
    a = ap.parse_args()
    results = []
    for name in a.models.split(","):
        r = run_model(name, a)
        results.append(r)
        if a.json:
            print(json.dumps(r), flush=True)
    if a.json:
        return 0
    print(f"| model | unconstrained | at {a.fraction} | overhead | why not |")
    print("|---|---|---|---|---|")
    good = 0
    for r in results:
        free, budgeted, overhead, why = row_of(r)
        good += free == "bitwise" and budgeted == "bitwise"
        print(f"| {r['model']} | {free} | {budgeted} | {overhead} | {why} |")
    print(f"\n{good} of {len(results)} train bitwise unconstrained and at {a.fraction}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
