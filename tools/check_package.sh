#!/usr/bin/env bash
# Installs the build and builds two projects against the installed package, as projects
# outside this tree use it, then runs them (CI runs this):
#   tests/consumer       COMPONENTS driver ops: the step driver, policy auto, the op library
#   tests/consumer_core  no components: the core alone, configured with CUDAToolkit, Boost and
#                        pkg-config (CBC) disabled; its binary must not load libcudart, libCbc
#                        or libgecode
# and checks that asking for a component the package lacks fails with a message naming it.
#   bash tools/check_package.sh [BUILD_DIR]
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  echo "usage: bash tools/check_package.sh [BUILD_DIR]  (install BUILD_DIR, default build, and"
  echo "       build and run tests/consumer and tests/consumer_core against the installed copy)"
  exit 0
fi
cd "$(dirname "$0")/.."
build="${1:-build}"
prefix="$PWD/$build/install"
jobs="$(nproc 2>/dev/null || echo 2)"
cmake --install "$build" --prefix "$prefix" >/dev/null

cmake -S tests/consumer -B build-consumer -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build-consumer -j"$jobs"
build-consumer/remat_consumer

cmake -S tests/consumer_core -B build-consumer-core -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON >/dev/null
cmake --build build-consumer-core -j"$jobs"
if ldd build-consumer-core/remat_consumer_core | grep -E 'libcudart|libCbc|libgecode'; then
  echo "FAIL: a program linking only remat::remat loads the libraries above"
  exit 1
fi
build-consumer-core/remat_consumer_core

# A component this installation does not have: configuring fails and names it.
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf 'cmake_minimum_required(VERSION 3.24)\nproject(probe LANGUAGES CXX)\n%s\n' \
  'find_package(remat CONFIG REQUIRED COMPONENTS no_such_part)' >"$probe/CMakeLists.txt"
if out="$(cmake -S "$probe" -B "$probe/build" -DCMAKE_PREFIX_PATH="$prefix" 2>&1)"; then
  echo "FAIL: find_package(remat COMPONENTS no_such_part) succeeded"
  exit 1
fi
grep -q "no_such_part" <<<"$out" || { echo "FAIL: the error does not name the component"; exit 1; }
echo "package: consumers built and ran; the core needs no CUDA, CBC, Gecode or Boost"
