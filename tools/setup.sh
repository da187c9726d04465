#!/usr/bin/env bash
# Installs the Debian packages remat builds against, and PyTorch from PyPI for the optional
# PyTorch backend (pytorch/). Idempotent; safe to re-run.
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  echo "usage: bash tools/setup.sh  (installs the Debian packages remat builds against, and"
  echo "       torch and torchvision from PyPI for the PyTorch backend; REMAT_SETUP_TORCH=0 skips"
  echo "       them)"
  exit 0
fi
pkgs=(cmake g++ make libabsl-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
      nlohmann-json3-dev libboost-dev libboost-graph-dev libboost-program-options-dev
      coinor-libcbc-dev libgecode-dev libopenblas-dev clang-format libopenmpi-dev openmpi-bin)
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

# PyTorch for remat::torch: the current release from PyPI, for python3. Where the CUDA 13
# toolkit's libraries are installed (this project's machines), the wheels come without the
# 3 GB of CUDA libraries pip would add, but the four the toolkit lacks: the toolkit's serve
# torch's CUDA build. Elsewhere pip installs torch with everything it asks for.
if [[ "${REMAT_SETUP_TORCH:-1}" != "0" ]] && ! python3 -c "import torch, torchvision" >/dev/null 2>&1; then
  echo "setup: installing torch and torchvision from PyPI"
  log="$(mktemp)"
  if ldconfig -p 2>/dev/null | grep -q "libcudart.so.13"; then
    pip_args=(--no-deps torch torchvision nvidia-cufile nvidia-cusparselt-cu13
              nvidia-nvshmem-cu13 nvidia-nccl-cu13 filelock fsspec sympy mpmath networkx
              jinja2 MarkupSafe typing_extensions numpy pillow)
  else
    pip_args=(torch torchvision)
  fi
  if ! python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
         "${pip_args[@]}" >"$log" 2>&1 || ! python3 -c "import torch, torchvision" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: installing torch failed; the PyTorch backend will not be built" >&2
  fi
  rm -f "$log"
fi
