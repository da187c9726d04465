#!/usr/bin/env python3
"""The gpt_train model in PyTorch, for timing remat against its peer on the same machine.

    python3 bench/peer/gpt_torch.py [--layers 4 --channels 128 --heads 4 --vocab 256
        --batch 8 --t 256 --dropout 0.1 --steps 6 --threads 2]
        [--checkpoint none|every|every2] [--compile-budget F] [--attention sdpa|math]
        [--device cpu|remat [--budget BYTES] [--policy dtr|auto] [--host-memory MIB]] [--json]

Same shapes, initialisation scale, dropout and AdamW (lr 1e-3, no weight decay) as
examples/gpt_model.cc: a pre-LayerNorm GPT with learned positions, tanh GELU, causal
attention, dropout after the attention and MLP projections, the language-model head tied
to the token embedding. Attention is F.scaled_dot_product_attention (causal), as PyTorch
programs write it, whose CPU kernel never materializes the scores; `--attention math`
computes it as gpt_train's kernels do, the scores, masked scores and softmax (batch x heads
x T x T each) materialized and saved. `--checkpoint every` wraps each block in torch.utils.checkpoint,
`every2` each pair of blocks. Reports the median step time (the first step is a warm-up and
not counted), and two peaks: `peak_live_bytes`, the most bytes of tensor storage alive at
once during a step (parameters, optimizer state, activations, gradients: what remat's
peak_allocated_bytes counts), from the profiler's record of the CPU allocator's allocations
and frees in one step, and `process_peak_rss_bytes`. `--compile-budget F` trains the
model compiled by torch.compile with `activation_memory_budget` F (its min-cut partitioner
keeps that fraction of the activations and recomputes the rest). `--device remat` trains the
same program on remat's PyTorch device (PYTHONPATH=build/python) under `--budget` bytes,
each step marked with remat_torch.step() (what policy `auto` plans), and
reports remat's peak reserved bytes as `peak_live_bytes` (what its budget caps), with its
evictions, recomputations and compute overhead. Needs torch (bash tools/setup.sh installs it
from PyPI); exits 3 where it is absent.
"""
import argparse
import contextlib
import json
import math
import resource
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
except ImportError:
    if "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        sys.exit(0)
    print("gpt_torch: torch is not installed (bash tools/setup.sh installs it from PyPI)",
          file=sys.stderr)
    sys.exit(3)


class Block(nn.Module):
    def __init__(self, c, heads, dropout, proj_std, attention="sdpa"):
        super().__init__()
        self.heads = heads
        self.fused = attention == "sdpa"
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.attproj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fcproj = nn.Linear(4 * c, c)
        self.drop = nn.Dropout(dropout)
        for lin, std in ((self.qkv, 0.02), (self.attproj, proj_std), (self.fc, 0.02),
                         (self.fcproj, proj_std)):
            nn.init.normal_(lin.weight, 0.0, std)
            nn.init.zeros_(lin.bias)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # as gpt_train's kernels do: the scores and their softmax materialized
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return y.transpose(1, 2).reshape(b, t, c)

    def forward(self, x):
        x = x + self.drop(self.attproj(self.attention(self.ln1(x))))
        h = F.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + self.drop(self.fcproj(h))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        proj_std = 0.02 / math.sqrt(2.0 * a.layers)
        self.wte = nn.Parameter(torch.randn(a.vocab, a.channels) * 0.02)
        self.wpe = nn.Parameter(torch.randn(a.t, a.channels) * 0.01)
        self.blocks = nn.ModuleList(
            Block(a.channels, a.heads, a.dropout, proj_std, getattr(a, "attention", "sdpa"))
            for _ in range(a.layers))
        self.lnf = nn.LayerNorm(a.channels)
        self.checkpoint = a.checkpoint

    def run_blocks(self, x, blocks):
        for blk in blocks:
            x = blk(x)
        return x

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte[idx] + self.wpe[:t]
        group = {"none": 0, "every": 1, "every2": 2}[self.checkpoint]
        if group == 0:
            x = self.run_blocks(x, self.blocks)
        else:
            for i in range(0, len(self.blocks), group):
                part = list(self.blocks[i:i + group])
                x = checkpoint(lambda y, p=part: self.run_blocks(y, p), x, use_reentrant=False)
        logits = self.lnf(x).reshape(b * t, -1) @ self.wte.t()
        return F.cross_entropy(logits, targets.reshape(-1))


def step_peak_bytes(run_step, start_bytes):
    """Peak bytes of tensor storage alive during `run_step()`, at op granularity: every op's
    own allocations less its own frees (the profiler's self CPU memory), and the frees made
    between ops when Python drops a tensor, summed in time order on top of what was alive
    before (parameters and optimizer state)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        run_step()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    live = peak = start_bytes
    for e in events:
        live += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--t", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkpoint", choices=["none", "every", "every2"], default="none")
    ap.add_argument("--attention", choices=["sdpa", "math"], default="sdpa",
                    help="F.scaled_dot_product_attention, or the scores materialized")
    ap.add_argument("--compile-budget", type=float, default=None,
                    help="torch.compile with this activation_memory_budget")
    ap.add_argument("--device", choices=["cpu", "remat"], default="cpu")
    ap.add_argument("--budget", type=int, default=None, help="remat's budget in bytes")
    ap.add_argument("--policy", default="dtr",
                    help="remat_torch's policy: an eviction policy, or auto (plans the marked steps)")
    ap.add_argument("--host-memory", type=int, default=0, metavar="MIB",
                    help="remat_torch's host memory for the optimizer's state (MiB; 0: none)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = Gpt(a)
    device = torch.device("cpu")
    if a.device == "remat":
        import remat_torch
        remat_torch.set_policy(a.policy)
        remat_torch.set_host_memory(a.host_memory << 20)
        remat_torch.set_budget(a.budget)
        device = remat_torch.device
        model = model.to(device)
    forward = model
    if a.compile_budget is not None:
        import torch._functorch.config as functorch_config
        functorch_config.activation_memory_budget = a.compile_budget
        forward = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    times, losses, peak = [], [], 0
    # Steps before the measured one: compiling takes two (the first call, then a recompile
    # once torch.compile sees the shapes repeat), and a compiled step is timed after both;
    # remat_torch's policy auto under a budget records its second step and tries a plan on
    # its third (Note [Planned steps on the device]).
    planned = a.device == "remat" and a.policy == "auto" and a.budget is not None
    warmup = 3 if a.compile_budget is not None or planned else 1
    for step in range(a.steps + warmup):
        idx = torch.randint(0, a.vocab, (a.batch, a.t), generator=gen).to(device)
        tgt = torch.randint(0, a.vocab, (a.batch, a.t), generator=gen).to(device)
        # Profiling slows a step: measured once, not timed. remat measures its own peak.
        measure = step == warmup and a.device == "cpu"
        if step == warmup and a.device == "remat":
            remat_torch.reset_peaks()
            before = remat_torch.stats()
        alive = sum(p.numel() * p.element_size() for p in model.parameters())
        alive += sum(v.numel() * v.element_size() for s in opt.state.values()
                     for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)

        # The last step's gradients go first, as PyTorch's examples write a step: they are
        # not held through the forward pass.
        def run_step():
            with remat_torch.step() if a.device == "remat" else contextlib.nullcontext():
                opt.zero_grad(set_to_none=True)
                loss = forward(idx, tgt)
                loss.backward()
                opt.step()
            return loss

        start = time.perf_counter()
        if measure:
            holder = []
            peak = step_peak_bytes(lambda: holder.append(run_step()), alive)
            loss = holder[0]
        else:
            loss = run_step()
        elapsed = time.perf_counter() - start
        losses.append(loss.item())
        if step > warmup or (step == warmup and a.steps == 1):
            times.append(elapsed)
    extra = {}
    if a.device == "remat":
        after = remat_torch.stats()
        peak = after["peak_reserved_bytes"]
        extra = {k: after[k] - before[k] for k in
                 ("evictions", "recomputations", "placed_allocations", "placement_misses",
                  "offloads")}
        cost = after["base_cost"] - before["base_cost"]
        extra["compute_overhead"] = (after["recompute_cost"] - before["recompute_cost"]) / cost
        extra["budget"] = a.budget
        extra["policy"] = a.policy
        extra["host_memory_bytes"] = a.host_memory << 20
        extra["plan"] = remat_torch.plan_report()
    result = {
        "system": "remat_torch" if a.device == "remat" else "pytorch",
        "torch": torch.__version__, "checkpoint": a.checkpoint,
        "compile_budget": a.compile_budget, **extra,
        "layers": a.layers, "channels": a.channels, "heads": a.heads, "batch": a.batch,
        "t": a.t, "threads": a.threads, "attention": a.attention, "steps_timed": len(times),
        "step_seconds_median": statistics.median(times),
        "step_seconds": times, "peak_live_bytes": peak,
        "process_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "losses": losses,
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(f"{result['system']} {torch.__version__} checkpoint={a.checkpoint}: step "
              f"{result['step_seconds_median'] * 1e3:.1f} ms (median of {len(times)}), "
              f"peak live {peak / 2**20:.1f} MiB, rss {result['process_peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
