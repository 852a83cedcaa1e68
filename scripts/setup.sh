#!/usr/bin/env bash
# Idempotent set-up. Installs the Debian packages triax needs (when missing), then configures and
# builds with CMake and Ninja.
#   scripts/setup.sh [BUILD_DIR] [extra cmake args...]          the library and its example programs
#                                                                (README command 1: no test targets)
#   scripts/setup.sh --tests [BUILD_DIR] [extra cmake args...]  also what only tests and benchmarks
#                                                                need, and every target (scripts/test.sh)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
with_tests=0
if [ "${1:-}" = "--tests" ]; then with_tests=1; shift; fi
build=${1:-$here/build}
shift || true

# Building and running the library and its examples: compiler, CMake, Ninja, MPI, rdma-core, fmt,
# OpenBLAS (OpenMP build), toml++, nlohmann-json, CLI11, OpenSSL (checkpoint SHA-256), cpp-httplib
# (/metrics), Gloo (runs without mpirun); python3 runs scripts/prepare_data.py.
pkgs=(build-essential cmake ninja-build pkg-config git
      openmpi-bin libopenmpi-dev libibverbs-dev rdma-core
      libfmt-dev libopenblas-dev libopenblas0-openmp
      libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libssl-dev python3 procps
      libcpp-httplib-dev libgloo-dev)
# Only the tests and benchmarks: Catch2; Prometheus (promtool, a scraping test); a one-node Slurm
# (slurm-wlm, munge); PyYAML (manifest checks); torch and numpy (HF/torch reference checks);
# matplotlib (scripts/plot_run.py, the plot.run test).
test_pkgs=(catch2 prometheus slurm-wlm munge python3-yaml python3-torch python3-numpy python3-matplotlib)
((with_tests)) && pkgs+=("${test_pkgs[@]}")
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
if ((with_tests)) && ! python3 -c 'import lizard' 2>/dev/null; then
  echo "setup: installing lizard (PyPI)"
  # A virtualenv or pyenv Python takes it as is; Debian's own Python only into ~/.local (PEP 668).
  python3 -m pip install -q lizard==1.24.3 2>/dev/null ||
    python3 -m pip install -q --user --break-system-packages lizard==1.24.3 ||
    echo "setup: lizard could not be installed; only the test house.function_length needs it"
fi
# The cuDNN frontend's header-only C++ API (PyPI wheel nvidia-cudnn-frontend, pinned in the script)
# into .deps/cudnn-frontend: CMake then compiles cuDNN's fused attention. Only where nvcc exists
# and the build is not told -DTRIAX_WITH_CUDA=OFF.
cuda_off=0
for a in "$@"; do [ "$a" = "-DTRIAX_WITH_CUDA=OFF" ] && cuda_off=1; done
if ((!cuda_off)) && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  "$here/scripts/fetch_cudnn_frontend.sh" ||
    echo "setup: the cuDNN frontend headers could not be installed; building without cuDNN attention (the CUDA kernels run instead)"
fi
# OpenBLAS built for OpenMP: one thread pool with triax's own OpenMP loops (see DESIGN.md).
if update-alternatives --list libblas.so.3-x86_64-linux-gnu >/dev/null 2>&1; then
  alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu | grep openblas-openmp | head -n1 || true)
  [ -n "$alt" ] && { [ "$(id -u)" -eq 0 ] && update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null || true; }
fi

# The lean build (default) configures no test or benchmark target, so CMake never looks for Catch2;
# the options come before the caller's arguments, which may override them.
if ((with_tests)); then
  opts=(-DTRIAX_BUILD_TESTS=ON -DTRIAX_BUILD_BENCHMARKS=ON)
else
  opts=(-DTRIAX_BUILD_TESTS=OFF -DTRIAX_BUILD_BENCHMARKS=OFF)
fi
jobs=${TRIAX_JOBS:-$(nproc)}
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${opts[@]}" "$@"
cmake --build "$build" -j "$jobs"
