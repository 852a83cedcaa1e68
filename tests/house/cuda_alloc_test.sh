#!/usr/bin/env bash
# No CUDA launcher allocates device memory per call: the check passes on the tree, and fails
# (naming file and line) on a minimal tree where a kernel or a src/cuda file allocates or frees.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
check="$here/scripts/check_cuda_alloc.py"
python3 "$check" --root "$here"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels" "$tmp/src/cuda"
printf 'TRIAX_CHECK_CUDA(cudaMallocAsync(&p, n, s));\n' > "$tmp/src/cuda/scratch.cpp"       # an owner
printf '// cudaMalloc(&p, n) in a comment, and "cudaFree(" in a string\nauto s = "cudaFree(";\n' > "$tmp/kernels/gelu.cu"
printf 'Scratch partial(n, stream);  // cuda/scratch.h\n' > "$tmp/kernels/grad_norm.cu"
python3 "$check" --root "$tmp" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }

. "$here/tests/house/refuse.sh"  # expect_refused FILE TEXT NEEDLE
expect_refused kernels/layernorm.cu '  TRIAX_CHECK_CUDA(cudaMallocAsync(&p, nbytes, stream));' \
  "kernels/layernorm.cu:1: allocates device memory per call (cudaMallocAsync)"
expect_refused kernels/common.cuh '  ~Scratch() { (void)cudaFreeAsync (p_, stream_); }' "kernels/common.cuh:1:"
expect_refused src/cuda/linear.cpp 'cudaMalloc(&ws, bytes);' "src/cuda/linear.cpp:1: allocates device memory per call (cudaMalloc)"
echo "cuda alloc test: ok"
