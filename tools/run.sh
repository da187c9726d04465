#!/usr/bin/env bash
# The README's main job: set up, build, and train the GPT-2-shaped example on the CPU with a
# sequence length drawn per batch: first unconstrained, then under half of that run's peak
# memory, printing both (the losses match bit for bit). Extra arguments go to gpt_train,
# e.g. `bash tools/run.sh --budget-fraction 0.3 --json`.
#   bash tools/run.sh --replay [TRACE.log] [remat-replay flags]   # the recorded-step replay
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
jobs="$(nproc 2>/dev/null || echo 2)"
if [[ "${1:-}" == "--replay" ]]; then
  shift
  cmake --build build -j"$jobs" --target remat-replay
  trace="${1:-examples/traces/mlp12.log}"
  shift || true
  exec build/bin/remat-replay "$trace" --policy all --sweep "$@"
fi
cmake --build build -j"$jobs" --target gpt_train
# Half of the unconstrained peak unless the arguments give a budget (or --steps) of their own.
defaults=(--steps 30 --budget-fraction 0.5)
for arg in "$@"; do
  case "$arg" in
    --budget|--budget=*|--budget-fraction|--budget-fraction=*) defaults=("${defaults[@]:0:2}") ;;
  esac
done
for arg in "$@"; do
  case "$arg" in
    --steps|--steps=*) defaults=("${defaults[@]:2}") ;;
  esac
done
exec build/bin/gpt_train "${defaults[@]}" "$@"
