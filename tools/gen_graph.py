#!/usr/bin/env python3
"""Writes a generated training-step graph (remat-graph-v1) of about --nodes nodes.

The shape of a residual network's joint forward and backward graph: a parameter per layer,
a forward chain whose layers also read a random earlier layer within --skip (a residual),
the loss's tangent, then a backward chain where each layer's gradient reads the gradient
after it, its own forward activation and its parameter, and the parameter gradients. Sizes
and costs are drawn from --seed; with --far, that share of the layers also reads a random
earlier layer anywhere in the step (long skips, which no window bounds). Used to check
planners' time limits on large graphs:

    python3 tools/gen_graph.py --nodes 200000 > big.json
    build/bin/remat-plan big.json --algo best --budget-fraction 0.5 --time-limit 2
"""
import argparse
import json
import random
import sys


def generate(nodes, skip, seed, far=0.0):
    rng = random.Random(seed)
    layers = max(1, (nodes - 1) // 4)  # a parameter, an activation, two gradients per layer
    out = []

    def add(kind, phase, inputs, nbytes, cost):
        out.append({"id": len(out), "name": f"n{len(out)}", "kind": kind, "phase": phase,
                    "bytes": nbytes, "cost": cost, "inputs": sorted(set(inputs))})
        return len(out) - 1

    params, acts = [], []
    for layer in range(layers):
        params.append(add("input", "forward", [], rng.randint(1, 64) * 1024, 0))
        reads = [params[-1]]
        if acts:
            reads.append(acts[-1])
            reads.append(acts[max(0, len(acts) - rng.randint(1, skip))])
            if rng.random() < far:  # a long skip: any earlier layer of the step
                reads.append(acts[rng.randrange(len(acts))])
        acts.append(add("compute", "forward", reads, rng.randint(16, 1024) * 1024,
                        rng.randint(1, 100)))
    grad = add("tangent", "backward", [], 4, 0)
    for layer in reversed(range(layers)):
        reads = [grad, acts[layer], params[layer]]
        add("compute", "backward", [grad, acts[layer]], rng.randint(1, 64) * 1024,
            rng.randint(1, 100))  # the parameter's gradient
        grad = add("compute", "backward", reads, rng.randint(16, 1024) * 1024,
                   rng.randint(1, 200))
    return {"format": "remat-graph-v1", "name": f"generated_{len(out)}",
            "source": f"tools/gen_graph.py --nodes {nodes} --skip {skip} --seed {seed} --far {far}",
            "nodes": out, "outputs": [out[-1]["id"]]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=200000, help="about this many nodes")
    p.add_argument("--skip", type=int, default=8, help="residuals reach this many layers back")
    p.add_argument("--seed", type=int, default=1, help="seed of sizes, costs and skips")
    p.add_argument("--far", type=float, default=0.0,
                   help="the share of layers that also read a random earlier layer anywhere")
    a = p.parse_args()
    if a.nodes < 5 or a.skip < 1 or not 0 <= a.far <= 1:
        p.error("--nodes wants at least 5, --skip at least 1 and --far a share in [0, 1]")
    json.dump(generate(a.nodes, a.skip, a.seed, a.far), sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
