#!/usr/bin/env bash
# One command that proves the CUDA path on a machine with a GPU, and writes one JSON report.
#
#   bash tools/gpu_check.sh [--report FILE] [--quick] [--prebuilt | --bundle FILE]
#                           [--no-host-tests] [--step-timeout SECONDS]
#
# With a GPU: builds (default architectures), checks the library carries code for them, runs
# every CUDA test (none may skip), runs them under compute-sanitizer memcheck and racecheck
# (failing where it cannot), trains every example on --backend cuda under a budget and compares
# it bit for bit with the unconstrained run, and runs the GPT-2 124M benchmarks: steps at 0.5
# and 0.4 of the unconstrained peak, and the largest batch that fits unconstrained (no
# eviction) against larger batches under that same memory (per-sample time of warm steps,
# tools/batch_scaling.py, at most 1.3x). --quick skips the benchmarks. Without a GPU: says so, runs the host-side tests (the
# CUDA kernel sources executed on the CPU, the CUDA backend on a simulated device) and exits
# 0. The report (default gpu_check.json) lists every step with its status; it is rewritten after
# every step, so a run stopped part-way still leaves one. --prebuilt uses build/bin as it is
# (for a GPU machine that cannot install the build's packages: build elsewhere, carry build/bin
# and the libraries it needs on LD_LIBRARY_PATH); --bundle FILE unpacks what
# tools/gpu_bundle.sh packed and runs it so; --no-host-tests leaves the host-side tests to
# CI; --step-timeout stops any one step after that many seconds (a failure).
set -uo pipefail
caller_dir="$PWD"
cd "$(dirname "$0")/.."
# The toolkit's tools (compute-sanitizer) are not on PATH on a fresh machine.
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
report=gpu_check.json
quick=0
prebuilt=0
host_tests=1
step_timeout=0
bundle=""
while (($#)); do
  case "$1" in
    --report) report="${2:?--report needs a file}"; shift 2 ;;
    --quick) quick=1; shift ;;
    --prebuilt) prebuilt=1; shift ;;
    --bundle) bundle="${2:?--bundle needs a file}"; prebuilt=1; shift 2 ;;
    --no-host-tests) host_tests=0; shift ;;
    --step-timeout) step_timeout="${2:?--step-timeout needs seconds}"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# Paths given relative to where the script was called from.
[[ "$report" = /* ]] || report="$caller_dir/$report"
[[ -z "$bundle" || "$bundle" = /* ]] || bundle="$caller_dir/$bundle"
jobs=$(nproc 2>/dev/null || echo 2)
steps=()   # JSON objects, one per step
failed=0
# Runs "$@" as step $name, recording its status, time and last output lines.
step() {
  local name="$1"; shift
  local start end out rc
  start=$(date +%s.%N)
  if ((step_timeout > 0)); then
    # timeout runs programs, not this script's functions: a function runs in a bash that is
    # given the functions and the GPT-2 flags.
    local cmd=("$@")
    if declare -F "$1" >/dev/null; then
      cmd=(bash -c "$(declare -f; declare -p gpt2 2>/dev/null); $(printf '%q ' "$@")")
    fi
    out="$(timeout -k 10 "$step_timeout" "${cmd[@]}" 2>&1)"; rc=$?
    ((rc == 124 || rc == 137)) && out+=$'\n'"gpu_check: step stopped after ${step_timeout} s"
  else
    out="$("$@" 2>&1)"; rc=$?
  fi
  end=$(date +%s.%N)
  echo "== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")"
  ((rc == 0)) || { failed=1; echo "$out" | tail -20; }
  steps+=("$(python3 -c 'import json,sys; print(json.dumps({"step":sys.argv[1],"ok":sys.argv[2]=="0","seconds":round(float(sys.argv[4])-float(sys.argv[3]),2),"output_tail":sys.argv[5][-4000:]}))' "$name" "$rc" "$start" "$end" "$out")")
  write_report "${gpu_json:-null}" >/dev/null
  return $rc
}
write_report() {
  local gpu="$1"
  { printf '{"gpu":%s,"ok":%s,"steps":[' "$gpu" "$([ $failed -eq 0 ] && echo true || echo false)"
    local IFS=,; printf '%s' "${steps[*]}"; printf ']}\n'; } > "$report"
  echo "gpu_check: report in $report"
}

if [[ -n "$bundle" ]]; then
  # build/bin becomes a link to the bundle's binaries; a real build/bin is left alone.
  if [[ -e build/bin && ! -L build/bin ]]; then
    echo "gpu_check: build/bin exists; --bundle would replace it (use --prebuilt)" >&2; exit 2
  fi
  unpacked="$PWD/build/bundle"  # replaced by each --bundle run
  rm -rf "$unpacked" && mkdir -p "$unpacked"
  tar -xJf "$bundle" -C "$unpacked" || { echo "gpu_check: cannot unpack $bundle" >&2; exit 2; }
  rm -f build/bin && ln -s bundle/bin build/bin
  export LD_LIBRARY_PATH="$unpacked/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ((prebuilt == 0)); then
  bash tools/setup.sh
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  step build cmake --build build -j"$jobs"
fi

# The CUDA path without a GPU: the kernel sources executed on the host, and the runtime's
# CUDA backend (streams, events, errors, virtual memory) on a simulated device.
host_side_tests() {
  ((host_tests)) || return 0
  step host_kernels build/bin/cuda_kernels_host_test
  step simulated_device build/bin/simulated_cuda_test
  step cuda_segment_sources build/bin/cuda_segment_source_test
  step stream_order build/bin/stream_order_test
  step batch_scaling_cpu python3 tools/batch_scaling.py --batch 2 --factors 2 --steps 2 \
    --limit 100 -- --backend cpu --layers 2 --channels 64
}

gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then gpu_name="$(nvidia-smi -L 2>/dev/null | head -1)"; fi
if [[ -z "$gpu_name" ]]; then
  echo "gpu_check: no GPU here (nvidia-smi lists none): running the host-side tests only"
  host_side_tests
  write_report null
  exit 0   # nothing on a GPU could be checked; the host tests' result is in the report
fi
echo "gpu_check: $gpu_name"
gpu_json="$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$gpu_name")"

if [[ -f build/lib/libremat_kernels_cuda.a ]]; then
  step cuda_images python3 tools/cuda_images.py build/lib/libremat_kernels_cuda.a
fi
no_skips() {  # runs a gtest binary and fails if any test skipped (a GPU must run them all)
  local out; out="$("$@" 2>&1)"; local rc=$?
  echo "$out" | tail -5
  ((rc == 0)) && ! grep -q "SKIPPED" <<<"$out"
}
step cuda_kernels no_skips build/bin/cuda_kernels_test
host_side_tests
step cuda_examples no_skips build/bin/examples_test --gtest_filter='*Cuda*'

# Every example on the GPU under a budget, bitwise against its unconstrained run.
bitwise() {  # example, budget fraction, flags...
  local out rc
  out="$(build/bin/"$1" --backend cuda --json --steps 3 --budget-fraction "$2" "${@:3}")"; rc=$?
  echo "$out" | cut -c1-1500   # a failed run's JSON names its error
  ((rc == 0)) && grep -q '"losses_match_baseline":true' <<<"$out"
}
step gpt_cuda_0.5 bitwise gpt_train 0.5
step mlp_cuda_0.6 bitwise mlp_train 0.6
step resnet_cuda_0.8 bitwise resnet_train 0.8
step treelstm_cuda_0.6 bitwise treelstm_train 0.6
# The sanitizers after the examples: they take longest of the quick steps.
if command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 build/bin/cuda_kernels_test
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 build/bin/cuda_kernels_test
  # The runtime's CUDA path (streams, events, copy streams, the pinned pool) under memcheck.
  step memcheck_examples compute-sanitizer --tool memcheck --error-exitcode 1 \
    build/bin/examples_test --gtest_filter='*Cuda*'
else
  # On a GPU machine a sanitizer that cannot run is a failed check, not a skipped one.
  step sanitizers sh -c 'echo "compute-sanitizer not found (PATH: $PATH)"; exit 1'
fi
# NCCL across 2 ranks, one GPU each (remat/nccl_collectives.h): sums in rank order, bit for
# bit. Needs 2 GPUs and mpirun; said so where either is missing.
if [[ -x build/bin/nccl_collectives_test ]] && command -v mpirun >/dev/null 2>&1 &&
   build/bin/nccl_collectives_test --probe >/dev/null; then
  step nccl_2_ranks env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np 2 --oversubscribe build/bin/nccl_collectives_test
  # The trainer's gradient buckets summed by NCCL on device memory (Note [Buckets on the
  # device]) against one process's two micro-batches, bit for bit, within each rank's budget.
  step nccl_gpt_train_2_ranks env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    python3 examples/data_parallel_check.py build/bin/gpt_train "$(command -v mpirun)" \
    --ranks 2 -- --backend cuda --steps 4 --batch 6 --bucket-bytes 256KiB
else
  echo "== nccl_2_ranks: skipped (needs build/bin/nccl_collectives_test, mpirun and 2 GPUs)"
fi

if ((quick == 0)); then
  gpt2=(--layers 12 --channels 768 --heads 12 --vocab 50257 --min-t 1024 --max-t 1024)
  # At batch 4 the parameters and AdamW's state take 1.5 GB, and cross_entropy_backward holds
  # the logits and their gradient (0.82 GB each) at once: 0.3 of the 9.1 GB peak (2.7 GB)
  # cannot fit (seen on an H200), 0.4 can. Planning is bounded so the step fits a lease.
  step gpt2_124m_0.5 bitwise gpt_train 0.5 "${gpt2[@]}" --batch 4 --plan-time-limit 5
  step gpt2_124m_0.4 bitwise gpt_train 0.4 "${gpt2[@]}" --batch 4 --plan-time-limit 5
  # The largest batch that fits unconstrained, then larger batches under its peak memory.
  # Without a budget a cudaMalloc the device refuses makes the runtime evict, so a batch the
  # device cannot hold would still run: fitting means no eviction at all.
  fits_unconstrained() {
    python3 -c 'import json,sys; d=json.loads(sys.stdin.read().splitlines()[-1]); sys.exit(0 if d.get("status")=="ok" and d.get("evictions")==0 else 1)'
  }
  largest_batch() {
    local b=1 best=0 out
    while ((b <= 64)); do
      out="$(build/bin/gpt_train --backend cuda --json --steps 2 "${gpt2[@]}" --batch $b 2>/dev/null)" || break
      fits_unconstrained <<<"$out" || break
      best=$b; echo "$out" | cut -c1-300; b=$((b * 2))
    done
    ((best > 0)) && echo "largest unconstrained batch: $best" && echo "$best" > build/largest_batch
  }
  step gpt2_124m_largest_batch largest_batch
  # Twice that batch under its peak memory, at no more than 1.3x its per-sample time. Four
  # times would not fit a lease (at 256, about 30 s a step on an H200). Planning runs beside the steps
  # (the command line's default): made in the step, it took most of the warm steps' time.
  if [[ -s build/largest_batch ]]; then
    step gpt2_124m_batch_scaling python3 tools/batch_scaling.py --batch "$(cat build/largest_batch)" \
      --factors 2 --steps 6 --limit 1.3 -- --backend cuda "${gpt2[@]}" --plan-time-limit 5
  fi
fi
# remat's partitioner inside torch.compile against activation_memory_budget on the GPU
# (docs/compile.md): three settings of the GPT, last, as it compiles for minutes.
if [[ -f build/python/remat_torch/_C.so ]]; then
  step compile_budgets_gpt_cuda env PYTHONPATH=build/python python3 \
    bench/peer/compile_budgets.py --device cuda --model gpt --fractions 1.0,0.5,0.0 \
    --steps 3 --json
fi
write_report "$gpu_json"
exit $failed
