#!/usr/bin/env python3
"""Data parallel against micro-batches: mpirun's N ranks of a trainer against one process.

    python3 examples/data_parallel_check.py TRAINER MPIRUN [--ranks N] [-- trainer flags...]

Runs TRAINER --micro-batches N in one process, then mpirun -np N TRAINER --data-parallel
with --zero 0 and --zero 1 (each rank's output in a file of its own: long JSON lines from
several ranks interleave on one pipe), unconstrained and at --budget-fraction 0.5. Every
rank must end with the losses and the final parameters' hash of the one process, bit for
bit, and within its budget, the ranks evicting and recomputing alike; with --zero 1 a
rank's pinned bytes must fall by at least
--min-state-fall of the optimizer state it holds with --zero 0. Exits 1 naming what
differs. ctest runs it (examples/CMakeLists.txt).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

KEYS = ("status", "losses", "final_state_fnv1a")


def run_json(cmd, env):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        sys.exit(f"data_parallel_check: {' '.join(cmd)} printed no JSON (exit {out.returncode})\n"
                 f"{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def check_rank(r, one, what):
    """What differs between rank result `r` and the one process's `one`, printed; ok?"""
    ok = True
    for k in KEYS:
        if r.get(k) != one.get(k):
            print(f"{what}: {k} {r.get(k)} != one process's {one.get(k)}")
            ok = False
    if r.get("budget_bytes") is not None and r["peak_reserved_bytes"] > r["budget_bytes"]:
        print(f"{what}: peak reserved {r['peak_reserved_bytes']} over its budget "
              f"{r['budget_bytes']}")
        ok = False
    print(f"{what}: {r['status']}, final loss {r['losses'][-1]}, state "
          f"{r.get('final_state_fnv1a')}, peak {r['peak_reserved_bytes']} of "
          f"{r.get('budget_bytes')}, pinned at the start {r['param_and_state_bytes']}")
    return ok


def ranks_json(mpirun, ranks, cmd, env):
    with tempfile.TemporaryDirectory() as d:
        full = [mpirun, "-np", str(ranks), "--oversubscribe", "-x", "OPENBLAS_NUM_THREADS",
                "--output-filename", d] + cmd + ["--data-parallel"]
        out = subprocess.run(full, capture_output=True, text=True, env=env, timeout=600)
        files = sorted(glob.glob(os.path.join(d, "*", "rank.*", "stdout")))
        results = []
        for f in files:
            lines = [l for l in open(f).read().splitlines() if l.startswith("{")]
            if lines:
                results.append(json.loads(lines[-1]))
        if len(results) != ranks:
            errs = "".join(open(f).read()[-2000:] for f in glob.glob(os.path.join(d, "*", "*", "stderr")))
            sys.exit(f"data_parallel_check: {len(results)} of {ranks} ranks printed JSON "
                     f"(mpirun exit {out.returncode})\n{out.stderr[-2000:]}\n{errs}")
        return results


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trainer")
    ap.add_argument("mpirun")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min-state-fall", type=float, default=0.35)
    ap.add_argument("--short-last-rank", metavar="BYTES",
                    help="also run with this budget on the last rank and room on the others: "
                         "every rank must stop with the same status, the others naming it")
    a = ap.parse_args(argv)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    failed = False
    for budget in ([], ["--budget-fraction", "0.5"]):
        cmd = [a.trainer, "--json"] + extra + budget
        one = run_json(cmd + ["--micro-batches", str(a.ranks)], env)
        if one["status"] != "ok":
            sys.exit(f"data_parallel_check: the one process did not fit: {one.get('error')}")
        pinned = {}
        for zero in ("0", "1"):
            results = ranks_json(a.mpirun, a.ranks, cmd + ["--zero", zero], env)
            for r in results:
                what = (f"rank {r.get('rank')} of {r.get('ranks')} --zero {zero} "
                        f"{' '.join(budget) or 'unconstrained'}")
                failed |= not check_rank(r, one, what)
                pinned[(zero, r.get("rank"))] = r
            failed |= not check_same_decisions(results, f"--zero {zero} {' '.join(budget)}")
        for rank in range(a.ranks):
            z0, z1 = pinned[("0", rank)], pinned[("1", rank)]
            fall = z0["param_and_state_bytes"] - z1["param_and_state_bytes"]
            share = fall / z0["optimizer_state_bytes"]
            print(f"rank {rank}: --zero 1 pins {fall} bytes less, {share:.2f} of the optimizer "
                  f"state's {z0['optimizer_state_bytes']}")
            if share < a.min_state_fall:
                print(f"rank {rank}: that is under {a.min_state_fall}")
                failed = True
    if a.short_last_rank:
        failed |= not check_short_rank(a, extra, env)
    sys.exit(1 if failed else 0)


def check_same_decisions(results, what):
    """Every rank evicted and recomputed the same (Note [Ranks that agree]): none waits on
    another's recomputation."""
    decisions = {(r["evictions"], r["recomputations"], r["peak_reserved_bytes"]) for r in results}
    if len(decisions) == 1:
        return True
    print(f"{what}: the ranks' evictions, recomputations and peaks differ: {sorted(decisions)}")
    return False


def check_short_rank(a, extra, env):
    """One rank's budget too small for a step (Note [Ranks that agree]): every rank ends,
    within ranks_json's timeout, with one status; the others' errors name the short rank."""
    last = a.ranks - 1
    budgets = ",".join(["1GB"] * last + [a.short_last_rank])
    cmd = [a.trainer, "--json", "--rank-budgets", budgets] + extra
    results = ranks_json(a.mpirun, a.ranks, cmd, env)
    ok = len({r["status"] for r in results}) == 1
    for r in results:
        print(f"rank {r['rank']} with --rank-budgets {budgets}: {r['status']}: "
              f"{r.get('error', '')[:160]}")
        if r["rank"] != last and r["status"] != "ok" and f"rank {last}" not in r.get("error", ""):
            print(f"rank {r['rank']}: its error does not name rank {last}")
            ok = False
    if not ok:
        print("the ranks did not agree")
    return ok


if __name__ == "__main__":
    main()
