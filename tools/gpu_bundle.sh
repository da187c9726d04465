#!/usr/bin/env bash
# Packs what tools/gpu_check.sh runs on a GPU into one file, for a GPU machine that cannot
# install the build's packages (one lent for minutes, without a network):
#
#   bash tools/gpu_bundle.sh [FILE]     (default .gpu/bundle.tar.xz)
#   ... then, on the GPU machine, from the repository's root:
#   bash tools/gpu_check.sh --bundle FILE [--no-host-tests] [--step-timeout S]
#
# Builds the check's binaries in build/ (configured as tools/setup.sh leaves it), strips
# them, and adds the shared libraries they need beyond the C and C++ runtimes and CUDA's own
# (abseil, the solvers, OpenBLAS): the GPU machine's driver and toolkit serve CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
out="${1:-.gpu/bundle.tar.xz}"
targets=(cuda_kernels_test cuda_kernels_host_test simulated_cuda_test cuda_segment_source_test
         stream_order_test examples_test gpt_train mlp_train resnet_train treelstm_train)
[[ -f build/CMakeCache.txt ]] || cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
# The NCCL test where this build has NCCL and MPI (gpu_check.sh runs it where 2 GPUs are).
# grep reads all of it: with -q, cmake would die of SIGPIPE and pipefail fail the test.
if cmake --build build --target help | grep nccl_collectives_test >/dev/null; then
  targets+=(nccl_collectives_test)
fi
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for t in "${targets[@]}"; do strip -o "$stage/bin/$t" "build/bin/$t"; done
# The C and C++ runtimes are the GPU machine's own (the same or newer), CUDA's its toolkit's.
skip='/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so'
if missing="$(for t in "${targets[@]}"; do ldd "build/bin/$t"; done | grep 'not found')"; then
  echo "gpu_bundle: libraries not found here:"$'\n'"$missing" >&2; exit 1
fi
for t in "${targets[@]}"; do ldd "build/bin/$t"; done | awk '/=> \//{print $3}' | sort -u |
  { grep -Ev "$skip" || true; } | while read -r lib; do
    cp -L "$lib" "$stage/lib/"
    strip --strip-unneeded "$stage/lib/$(basename "$lib")" 2>/dev/null || true
  done
mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" bin lib
echo "gpu_bundle: $out ($(du -h "$out" | cut -f1)): ${#targets[@]} binaries, $(ls "$stage/lib" | wc -l) libraries"
