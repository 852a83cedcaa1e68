#!/usr/bin/env python3
"""No device allocation per call in the CUDA launchers: kernels/ and src/cuda/ call no
cudaMalloc / cudaMallocAsync / cudaMallocFromPoolAsync / cudaMallocManaged / cudaMallocPitch and
no cudaFree / cudaFreeAsync, except in the few files that own memory on purpose:
  src/cuda/cuda_backend.cpp  the CUDA backend's stream-ordered pool allocator
  src/cuda/scratch.cpp       launcher scratch: the stream's arena, cudaMallocAsync only for
                             streams without one (tests that call launchers directly)
  src/cuda/allocator.cpp     the plain process-wide allocator for tests and tools
  src/cuda/gemm.cpp          cuBLASLt's workspace, once per CublasLtGemm
Launchers take scratch through kernels/common.cuh's Scratch (cuda/scratch.h). Pinned host
memory (cudaMallocHost / cudaHostAlloc) is not matched.

Usage: check_cuda_alloc.py [--root DIR]   exit 0 when clean, 1 otherwise (naming file:line).
"""
import os
import re
import sys

import source_scan

TOPS = ("kernels", os.path.join("src", "cuda"))
ALLOWED = {os.path.join("src", "cuda", f) for f in ("cuda_backend.cpp", "scratch.cpp", "allocator.cpp", "gemm.cpp")}
CALL = re.compile(r"\b(cudaMalloc(?:Async|FromPoolAsync|Managed|Pitch|3D|Array)?|cudaFree(?:Async)?)\s*\(")


def check(root):
    return [f"{rel}:{lineno}: allocates device memory per call ({m.group(1)}); "
            "take launcher scratch through Scratch (cuda/scratch.h)"
            for rel, lineno, m in source_scan.matches(root, TOPS, ALLOWED, CALL)]


if __name__ == "__main__":
    sys.exit(source_scan.run(__doc__, check, "{n} device allocation(s) in launchers",
                             "no launcher allocates device memory per call"))
