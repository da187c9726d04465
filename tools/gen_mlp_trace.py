#!/usr/bin/env python3
"""Writes a training step of an MLP in the DTR log format (see docs/formats.md, "DTR log").

The step is synthetic but shaped like the real thing: per layer a matmul, a bias add (a view
of the bias broadcast), a ReLU; then a loss, and a backward pass that reads the forward
activations in reverse order. Times are FLOP-proportional nanoseconds. It is the embedded
default input of the main job (tools/run.sh), so the project runs with nothing beside it.

    python3 tools/gen_mlp_trace.py > examples/traces/mlp12.log
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--width", type=int, default=512)
    a = ap.parse_args()
    out = []
    n = [0]

    def emit(**kw):
        out.append(json.dumps(kw, sort_keys=True))

    def fresh():
        n[0] += 1
        return f"x{n[0]}"

    def const(size):
        h = fresh()
        emit(INSTRUCTION="CONSTANT", NAME=h)
        emit(INSTRUCTION="MEMORY", NAME=h, MEMORY=str(size))
        return h

    def call(op, args, sizes, ns, alias=None):
        res = [fresh() for _ in sizes]
        emit(INSTRUCTION="CALL", NAME=op, ARGS=args, RESULT=res, TIME=str(int(ns)))
        for i, (r, s) in enumerate(zip(res, sizes)):
            emit(INSTRUCTION="MEMORY", NAME=r, MEMORY=str(s))
            emit(INSTRUCTION="ALIAS", NAME=r, ALIAS=str(alias[i] if alias else -1))
        return res

    def release(h):
        emit(INSTRUCTION="RELEASE", NAME=h)

    B, W, L = a.batch, a.width, a.layers
    act = B * W * 4
    gemm_ns = 2 * B * W * W / 20.0  # about 20 GFLOP/s per ns scale: only ratios matter
    ew_ns = B * W / 50.0
    emit(INSTRUCTION="ANNOTATE", ANNOTATION="START")
    weights = [const(W * W * 4) for _ in range(L)]
    biases = [const(W * 4) for _ in range(L)]
    x = const(act)
    acts = [x]
    pre = []
    for i in range(L):
        (h,) = call("mm", [acts[-1], weights[i]], [act], gemm_ns)
        (bv,) = call("expand", [biases[i]], [act], 1, alias=[0])
        (z,) = call("add", [h, bv], [act], ew_ns)
        release(h)
        release(bv)
        (y,) = call("relu", [z], [act], ew_ns)
        pre.append(z)
        acts.append(y)
    (loss,) = call("sum", [acts[-1]], [4], ew_ns)
    emit(INSTRUCTION="ANNOTATE", ANNOTATION="BACKWARD")
    (g,) = call("ones_like", [acts[-1]], [act], ew_ns)
    for i in reversed(range(L)):
        (gz,) = call("threshold_backward", [g, pre[i]], [act], ew_ns)
        release(g)
        release(pre[i])
        (gw,) = call("mm", [acts[i], gz], [W * W * 4], gemm_ns)
        (gb,) = call("sum_dim", [gz], [W * 4], ew_ns)
        # The optimizer consumes the gradients at once, as a fused backward+step loop does.
        call("sgd_step", [weights[i], gw, biases[i], gb], [], ew_ns)
        release(gw)
        release(gb)
        (gx,) = call("mm", [gz, weights[i]], [act], gemm_ns)
        release(gz)
        # acts[i + 1] went at the iteration before (as its acts[i]); releasing it again would
        # be a double release, which the parser rejects.
        if i > 0:
            release(acts[i])
        g = gx
    release(g)
    print("\n".join(out))


if __name__ == "__main__":
    main()
