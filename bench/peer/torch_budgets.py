#!/usr/bin/env python3
"""A torch program on remat's PyTorch device under budgets, against the same program on the CPU.

    PYTHONPATH=build/python python3 bench/peer/torch_budgets.py [--model resnet18|densenet121|gpt|NAME]
        [--steps 3] [--fractions 0.7,0.5,0.4,0.3] [--policy dtr] [--host-memory MIB] [--json]
        [--batch 4] [--size 64]

Trains the model for --steps steps on the CPU, then on remat's device unconstrained, then
under each budget: the parameters, gradients and optimizer state, plus the fraction of the
activation bytes above them (the unconstrained run's peak of allocated bytes less those).
Prints per budget whether the run fit, whether its losses, parameters and buffers equal the
CPU run's bit for bit, its peak reserved bytes, evictions, recomputations and compute
overhead, and the median step time of each run (the first step not counted).
resnet18: torchvision's, 10 classes, batch 8 at 128x128, SGD with momentum 0.9 and weight
decay 5e-4. densenet121: torchvision's, 10 classes, batch 4 at 96x96, the same SGD. gpt:
bench/peer/gpt_torch.py's model (4 layers, 128 channels, 4 heads, vocabulary 256, T 256,
batch 8, dropout 0.1), AdamW, deterministic algorithms on. Any other NAME: torchvision's
classifier of that name (torchvision.models.list_models()), 10 classes, --batch images of
--size x --size, the same SGD. A run that raises is a row with its error.
"""
import argparse
import contextlib
import copy
import json
import pathlib
import statistics
import sys
import time
import types

try:
    import torch
    import torch.nn.functional as F
    import remat_torch
except ImportError as e:
    if "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        sys.exit(0)
    print(f"torch_budgets: {e} (bash tools/setup.sh; PYTHONPATH=build/python)", file=sys.stderr)
    sys.exit(3)


def logits(out):
    """A classifier's logits; GoogLeNet and Inception return them first of a tuple in training."""
    return out[0] if isinstance(out, tuple) else out


def torchvision_classifier(name, batch, size, steps):
    """torchvision's `name` with 10 classes on random images, SGD with momentum."""
    import torchvision
    torch.manual_seed(0)
    extra = {"image_size": size} if name.startswith("vit_") else {}
    model = torchvision.models.get_model(name, num_classes=10, **extra)
    batches = [(torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,)))
               for _ in range(steps)]
    opt = lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=5e-4)
    return model, batches, opt, 1, lambda m, x, y: F.cross_entropy(logits(m(x)), y)


def resnet18(steps):
    return torchvision_classifier("resnet18", 8, 128, steps)


def densenet121(steps):
    return torchvision_classifier("densenet121", 4, 96, steps)


def gpt(steps):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from gpt_torch import Gpt
    shape = types.SimpleNamespace(layers=4, channels=128, heads=4, vocab=256, t=256,
                                  dropout=0.1, checkpoint="none")
    torch.manual_seed(0)
    model = Gpt(shape)
    batches = [(torch.randint(0, 256, (8, 256)), torch.randint(0, 256, (8, 256)))
               for _ in range(steps)]
    opt = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01)
    torch.use_deterministic_algorithms(True)
    return model, batches, opt, 2, lambda m, x, y: m(x, y)


def train(spec, device):
    model, batches, make_opt, _, loss_of = spec
    torch.manual_seed(1234)
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    losses, times = [], []
    for x, y in batches:
        start = time.perf_counter()
        with remat_torch.step() if device != "cpu" else contextlib.nullcontext():
            opt.zero_grad()
            loss = loss_of(model, x.to(device), y.to(device))
            loss.backward()
            opt.step()
        losses.append(loss.detach().cpu())
        times.append(time.perf_counter() - start)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return losses, state, statistics.median(times[1:]) if len(times) > 1 else times[0]


def equal(run, ref):
    return (all(torch.equal(a, b) for a, b in zip(run[0], ref[0])) and
            all(torch.equal(run[1][k], ref[1][k]) for k in ref[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18",
                    help="resnet18, densenet121, gpt, or any torchvision classifier's name")
    ap.add_argument("--batch", type=int, default=4, help="other torchvision classifiers: images")
    ap.add_argument("--size", type=int, default=64, help="other torchvision classifiers: pixels")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fractions", default="0.7,0.5,0.4,0.3")
    ap.add_argument("--policy", default="dtr",
                    help="remat_torch's policy: an eviction policy, or auto (plans the marked steps)")
    ap.add_argument("--host-memory", type=int, default=0, metavar="MIB",
                    help="host memory the optimizer's state may wait in during a step "
                         "(remat_torch.set_host_memory), MiB; 0: none")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    remat_torch.set_policy(a.policy)
    remat_torch.set_host_memory(a.host_memory << 20)
    named = {"resnet18": resnet18, "densenet121": densenet121, "gpt": gpt}
    spec = (named[a.model](a.steps) if a.model in named else
            torchvision_classifier(a.model, a.batch, a.size, a.steps))
    model, slots = spec[0], spec[3]
    fixed = sum(p.numel() * p.element_size() for p in model.parameters()) * (2 + slots)
    fixed += sum(b.numel() * b.element_size() for b in model.buffers())
    cpu = train(spec, "cpu")
    remat_torch.set_budget(None)
    remat_torch.reset_peaks()
    try:
        free = train(spec, remat_torch.device)
    except Exception as e:  # an unsupported operator, say: the row says which
        print(json.dumps({"model": a.model, "error": f"{type(e).__name__}: {e}"}) if a.json else
              f"{a.model}: unconstrained run failed: {type(e).__name__}: {e}")
        return 1
    peak = remat_torch.stats()["peak_allocated_bytes"]
    rows = [{"budget": None, "fraction": None, "fits": True, "bitwise": equal(free, cpu),
             "step_seconds": free[2], **remat_torch.stats()}]
    for fraction in [float(f) for f in a.fractions.split(",")]:
        budget = int(fixed + fraction * (peak - fixed))
        remat_torch.set_budget(budget)
        remat_torch.reset_peaks()
        before = remat_torch.stats()
        row = {"budget": budget, "fraction": fraction}
        try:
            run = train(spec, remat_torch.device)
            row.update(fits=True, bitwise=equal(run, cpu), step_seconds=run[2])
        except Exception as e:
            row.update(fits=False, error=f"{type(e).__name__}: {e}")
        after = remat_torch.stats()
        row.update(after)
        for k in ("evictions", "recomputations", "base_cost", "recompute_cost", "offloads"):
            row[k] = after[k] - before[k]
        row["compute_overhead"] = row["recompute_cost"] / row["base_cost"] if row["base_cost"] else 0
        rows.append(row)
    result = {"model": a.model, "torch": torch.__version__, "fixed_bytes": fixed,
              "host_memory_bytes": a.host_memory << 20,
              "unconstrained_peak_allocated_bytes": peak, "cpu_step_seconds": cpu[2],
              "rows": rows}
    if a.json:
        print(json.dumps(result))
        return 0
    print(f"{a.model}: fixed {fixed / 2**20:.1f} MiB, unconstrained peak {peak / 2**20:.1f} MiB, "
          f"CPU step {cpu[2]:.3f} s")
    for r in rows:
        what = "unconstrained" if r["fraction"] is None else f"{r['fraction']:.2f}"
        if not r["fits"]:
            print(f"  {what:>13}: out of memory ({r['error']})")
            continue
        print(f"  {what:>13}: bitwise {r['bitwise']}, peak reserved "
              f"{r['peak_reserved_bytes'] / 2**20:.1f} MiB, {r['evictions']} evictions, "
              f"{r['recomputations']} recomputations, overhead {r['compute_overhead']:.2f}, "
              f"step {r['step_seconds']:.3f} s"
              + (f", {r['offloads']} offloads" if r.get("offloads") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
