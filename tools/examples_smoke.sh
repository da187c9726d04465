#!/usr/bin/env bash
# Runs every training example at a small size under a budget and fails unless each run fits
# and matches its unconstrained run bit for bit. CI runs it on the sanitizer build.
#   bash tools/examples_smoke.sh build-asan/bin
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  echo "usage: bash tools/examples_smoke.sh [BIN_DIR]  (every example at a small size under a budget)"
  exit 0
fi
bin="${1:-build/bin}"
# Runs example $1 with flags ${@:3} under $2 times the bytes its unconstrained run allocated at
# most (at these sizes the reserved peak is one mostly idle segment).
run() {
  local out peak budget
  out="$("$bin/$1" --json --steps 2 "${@:3}")"
  peak="$(sed -E 's/.*"peak_allocated_bytes":([0-9]+).*/\1/' <<<"$out")"
  budget="$(awk -v p="$peak" -v f="$2" 'BEGIN { printf "%d", p * f }')"
  out="$("$bin/$1" --json --steps 2 --budget "$budget" "${@:3}")"
  echo "$out" | cut -c1-300
  grep -q '"status":"ok"' <<<"$out" || { echo "FAIL: $1 did not run"; exit 1; }
  grep -q '"losses_match_baseline":true' <<<"$out" || { echo "FAIL: $1 differs"; exit 1; }
  grep -q '"evictions":0,' <<<"$out" && { echo "FAIL: $1 never evicted"; exit 1; }
  return 0
}
run mlp_train 0.7 --batch 256 --in 32 --hidden 64 --layers 4
run gpt_train 0.9 --layers 2 --channels 32 --heads 2 --vocab 64 --batch 4 --min-t 8 --max-t 48
run resnet_train 0.95 --batch 4 --width 4 --image 16
run treelstm_train 0.7 --trees 6 --hidden 16 --vocab 16 --min-leaves 3 --max-leaves 10
echo "examples: all ok"
