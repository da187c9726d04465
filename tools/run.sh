#!/usr/bin/env bash
# The README's main job: set up, build, and replay a recorded training step under a budget
# sweep with every eviction policy, printing the result table. With no argument it replays
# the embedded default (examples/traces/mlp12.log); pass any DTR-format trace to replay that.
#   bash tools/run.sh                                   # embedded default
#   bash tools/run.sh ../shared/traces/dtr/resnet32.log --accounting allocator
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target remat-replay
trace="${1:-examples/traces/mlp12.log}"
shift || true
exec build/bin/remat-replay "$trace" --policy all --sweep "$@"
