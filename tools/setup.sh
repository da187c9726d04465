#!/usr/bin/env bash
# Installs the Debian packages remat builds against. Idempotent; safe to re-run.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  echo "usage: bash tools/setup.sh  (installs the Debian packages remat builds against)"
  exit 0
fi
pkgs=(cmake g++ make libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
      nlohmann-json3-dev libboost-dev libboost-graph-dev libboost-program-options-dev
      coinor-libcbc-dev libgecode-dev libopenblas-dev clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # apt's progress goes to a log, shown only if the installation fails.
  log="$(mktemp)"
  echo "setup: installing ${missing[*]}"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
           --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: installing ${missing[*]} failed" >&2
    exit 1
  fi
  rm -f "$log"
fi
