#!/usr/bin/env bash
# Idempotent set-up: installs the Debian packages triax needs (when missing), then configures
# and builds with CMake. Usage: scripts/setup.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$here/build}
shift || true

pkgs=(build-essential cmake ninja-build pkg-config git
      openmpi-bin libopenmpi-dev libibverbs-dev rdma-core
      libfmt-dev catch2 libopenblas-dev libopenblas0-openmp
      libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libssl-dev python3 procps
      libcpp-httplib-dev prometheus slurm-wlm munge python3-yaml libgloo-dev
      python3-matplotlib
      python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# lizard measures function lengths for the house.function_length test (Debian packages no C++
# metrics tool that parses this tree: pmccabe loses track of lambdas and skips whole functions).
if ! python3 -c 'import lizard' 2>/dev/null; then
  echo "setup: installing lizard (PyPI)"
  # A virtualenv or pyenv Python takes it as is; Debian's own Python only into ~/.local (PEP 668).
  python3 -m pip install -q lizard==1.24.3 2>/dev/null ||
    python3 -m pip install -q --user --break-system-packages lizard==1.24.3 ||
    echo "setup: lizard could not be installed; only the test house.function_length needs it"
fi
# The cuDNN frontend's header-only C++ API (PyPI wheel nvidia-cudnn-frontend, pinned in the script)
# into .deps/cudnn-frontend: CMake then compiles cuDNN's fused attention. Only where nvcc exists.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  "$here/scripts/fetch_cudnn_frontend.sh" ||
    echo "setup: the cuDNN frontend headers could not be installed; building without cuDNN attention (the CUDA kernels run instead)"
fi
# OpenBLAS built for OpenMP: one thread pool with triax's own OpenMP loops (see DESIGN.md).
if update-alternatives --list libblas.so.3-x86_64-linux-gnu >/dev/null 2>&1; then
  alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu | grep openblas-openmp | head -n1 || true)
  [ -n "$alt" ] && { [ "$(id -u)" -eq 0 ] && update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null || true; }
fi

jobs=${TRIAX_JOBS:-$(nproc)}
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j "$jobs"
