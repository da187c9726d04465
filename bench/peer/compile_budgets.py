#!/usr/bin/env python3
"""torch.compile's activation_memory_budget against remat's partitioner at the same peak.

    PYTHONPATH=build/python python3 bench/peer/compile_budgets.py [--model gpt|resnet18]
        [--fractions 1.0,0.7,0.5,0.3,0.1,0.0] [--steps 5] [--threads 2] [--json]
        [--sweep 6] [--svg PATH] [--device cpu|cuda]

For each fraction, the model's training step (forward and backward, the loss in the graph)
compiled by Inductor with PyTorch's own partitioner at that `activation_memory_budget`: its
measured peak (the CPU allocator's live bytes, or on --device cuda the CUDA caching
allocator's `max_memory_allocated`, the graph's inputs included) and median step time. Then `remat_torch.compile` with that measured peak as its budget in bytes: its measured
peak and median step time, the two steps run interleaved. gpt: bench/peer/gpt_torch.py's
model (4 layers, 128 channels, 4 heads, vocabulary 256, T 256, batch 8, dropout 0.1, scaled
dot product attention, the head tied to the embedding). resnet18: torchvision's, 10 classes,
batch 16 at 64x64. Dropout draws through eager's generator (`fallback_random`) in both.
With --sweep N, remat_torch.compile also runs at N budgets evenly from the least any plan
needs (its BudgetTooSmall names it) to the highest peak PyTorch measured: the budget asked
against the measured peak, beside PyTorch's measured peak at each fraction; --svg draws
both.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).parent))
remat_torch = None  # imported once the flags are read: --help needs no build


def make_model(name):
    torch.manual_seed(1)
    if name == "gpt":
        import gpt_torch
        a = types.SimpleNamespace(layers=4, channels=128, heads=4, vocab=256, t=256,
                                  dropout=0.1, checkpoint="none", attention="sdpa")
        return gpt_torch.Gpt(a), (torch.randint(0, 256, (8, 256)),
                                  torch.randint(0, 256, (8, 256)))
    import torchvision

    class Resnet18(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=10)

        def forward(self, x, y):
            return F.cross_entropy(self.net(x), y)
    return Resnet18(), (torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,)))


def held_bytes(model, inputs):
    tensors = [*model.parameters(), *model.buffers(), *inputs]
    return sum(t.numel() * t.element_size() for t in tensors)


def one_step(model, step, inputs):
    """(seconds, peak bytes above what was live) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    if inputs[0].is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        live = torch.cuda.memory_allocated()
        start = time.perf_counter()
        step(*inputs).backward()
        torch.cuda.synchronize()
        return time.perf_counter() - start, torch.cuda.max_memory_allocated() - live
    start = time.perf_counter()
    with remat_torch.cpu_memory() as meter:
        step(*inputs).backward()
    return time.perf_counter() - start, meter.peak_bytes


def compiled(model, fraction=None, budget=None):
    torch._dynamo.reset()
    if budget is not None:
        return remat_torch.compile(model, budget=budget)
    torch._functorch.config.activation_memory_budget = fraction
    return torch.compile(model)


def measure_pair(model, inputs, fraction, steps):
    held = held_bytes(model, inputs)
    theirs = compiled(model, fraction=fraction)
    one_step(model, theirs, inputs)  # compiles
    _, their_peak = one_step(model, theirs, inputs)
    budget = held + their_peak
    try:
        ours = compiled(model, budget=budget)
        one_step(model, ours, inputs)
    except Exception as error:  # a budget below what any plan needs
        return dict(fraction=fraction, torch_peak=budget, remat=str(error).splitlines()[-1])
    times = {"torch": [], "remat": []}
    peaks = {"torch": 0, "remat": 0}
    for _ in range(steps):  # interleaved: the machine's noise falls on both
        for name, step in (("torch", theirs), ("remat", ours)):
            seconds, peak = one_step(model, step, inputs)
            times[name].append(seconds)
            peaks[name] = max(peaks[name], held + peak)
    return dict(fraction=fraction, torch_peak=peaks["torch"],
                torch_s=statistics.median(times["torch"]), remat_budget=budget,
                remat_peak=peaks["remat"], remat_s=statistics.median(times["remat"]))


def least_budget(model, inputs):
    """The least budget remat_torch.compile finds any plan to need (what it names when
    refusing a budget of one byte above the inputs)."""
    try:
        one_step(model, compiled(model, budget=held_bytes(model, inputs) + 1), inputs)
    except Exception as error:  # noqa: BLE001 (Dynamo wraps the partitioner's error)
        while error is not None and not isinstance(error, remat_torch.BudgetTooSmall):
            error = getattr(error, "inner_exception", None) or error.__cause__
        if error is not None and error.least is not None:
            return error.least
    return None


def sweep(model, inputs, rows, points):
    """[(budget, measured peak)] of remat_torch.compile from the least feasible budget to
    the highest of PyTorch's measured peaks."""
    least = least_budget(model, inputs)
    top = max(r["torch_peak"] for r in rows)
    if least is None or points < 2 or least > top:
        return []
    held, found = held_bytes(model, inputs), []
    for k in range(points):
        budget = least + (top - least) * k // (points - 1)
        step = compiled(model, budget=budget)
        one_step(model, step, inputs)  # compiles
        found.append((budget, held + one_step(model, step, inputs)[1]))
    return found


def svg(model_name, rows, swept):
    """Two panels: remat's measured peak against the budget asked in bytes (the diagonal
    is the budget), and PyTorch's against its activation_memory_budget fraction."""
    width, height, pad = 340, 260, 50
    peaks = [p for _, p in swept] + [r["torch_peak"] for r in rows]
    lo, hi = min(peaks + [b for b, _ in swept]), max(peaks + [b for b, _ in swept])
    y = lambda v: height - pad - (v - lo) / max(hi - lo, 1) * (height - 2 * pad)
    x_bytes = lambda v: pad + (v - lo) / max(hi - lo, 1) * (width - 2 * pad)
    x_frac = lambda f: width + pad + f * (width - 2 * pad)
    mb = lambda v: f"{v / 1e6:.1f}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="{pad}" y="16">{model_name}, remat_torch.compile: measured peak</text>',
           f'<text x="{pad}" y="30">against the budget asked (MB; grey: the budget)</text>',
           f'<text x="{width + pad}" y="16">torch.compile: measured peak (MB)</text>',
           f'<text x="{width + pad}" y="30">against activation_memory_budget</text>',
           f'<line x1="{x_bytes(lo)}" y1="{y(lo)}" x2="{x_bytes(hi)}" y2="{y(hi)}" '
           'stroke="#bbb"/>']
    for offset in (0, width):  # axes
        out.append(f'<polyline fill="none" stroke="black" points="{offset + pad},{pad} '
                   f'{offset + pad},{height - pad} {offset + width - pad},{height - pad}"/>')
    for v in (lo, (lo + hi) / 2, hi):
        out.append(f'<text x="4" y="{y(v) + 4}">{mb(v)}</text>')
        out.append(f'<text x="{x_bytes(v) - 12}" y="{height - pad + 16}">{mb(v)}</text>')
    for f in (0.0, 0.5, 1.0):
        out.append(f'<text x="{x_frac(f) - 8}" y="{height - pad + 16}">{f}</text>')
    for budget, peak in swept:
        out.append(f'<circle cx="{x_bytes(budget):.1f}" cy="{y(peak):.1f}" r="3" fill="#06c"/>')
    for r in rows:
        out.append(f'<circle cx="{x_frac(r["fraction"]):.1f}" cy="{y(r["torch_peak"]):.1f}" '
                   'r="3" fill="#c60"/>')
    return "\n".join(out + ["</svg>"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["gpt", "resnet18"], default="gpt")
    ap.add_argument("--fractions", default="1.0,0.7,0.5,0.3,0.1,0.0")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sweep", type=int, default=0, help="remat budgets swept (0: none)")
    ap.add_argument("--svg", help="write the sweep's plot here")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = ap.parse_args()
    global remat_torch
    try:
        import remat_torch
    except ImportError:
        sys.exit("compile_budgets.py: remat_torch not found; build the project and run with "
                 "PYTHONPATH=build/python")
    torch.set_num_threads(a.threads)
    torch._inductor.config.fallback_random = True
    model, inputs = make_model(a.model)
    model, inputs = model.to(a.device), tuple(t.to(a.device) for t in inputs)
    rows = [measure_pair(model, inputs, float(f), a.steps) for f in a.fractions.split(",")]
    swept = sweep(model, inputs, rows, a.sweep) if a.sweep else []
    if a.svg:
        pathlib.Path(a.svg).write_text(svg(a.model, rows, swept))
    if a.json:
        print(json.dumps(dict(model=a.model, device=a.device, rows=rows, sweep=swept),
                         indent=1))
        return
    print("| activation_memory_budget | torch peak | torch s | remat peak | remat s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        if "remat" in r:
            print(f"| {r['fraction']} | {r['torch_peak']:,} | | {r['remat']} | |")
        else:
            print(f"| {r['fraction']} | {r['torch_peak']:,} | {r['torch_s']:.3f} | "
                  f"{r['remat_peak']:,} | {r['remat_s']:.3f} |")
    if swept:
        print("\n| remat budget | remat measured peak |\n| --- | --- |")
        for budget, peak in swept:
            print(f"| {budget:,} | {peak:,} |")


if __name__ == "__main__":
    main()
