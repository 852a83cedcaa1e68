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
import argparse
import os
import re
import sys

TOPS = ("kernels", os.path.join("src", "cuda"))
ALLOWED = {os.path.join("src", "cuda", f) for f in ("cuda_backend.cpp", "scratch.cpp", "allocator.cpp", "gemm.cpp")}
SOURCE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
CALL = re.compile(r"\b(cudaMalloc(?:Async|FromPoolAsync|Managed|Pitch|3D|Array)?|cudaFree(?:Async)?)\s*\(")
LINE_COMMENT = re.compile(r"//.*$")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def check(root):
    problems = []
    for top in TOPS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel in ALLOWED:
                    continue
                with open(path, errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = CALL.search(LINE_COMMENT.sub("", STRING.sub('""', line)))
                        if m:
                            problems.append(f"{rel}:{lineno}: allocates device memory per call ({m.group(1)}); "
                                            "take launcher scratch through Scratch (cuda/scratch.h)")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} device allocation(s) in launchers")
        return 1
    print("no launcher allocates device memory per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
