#!/usr/bin/env bash
# Every environment read goes through core/env.h: the check passes on the tree, and fails (naming
# file and line) on a minimal tree where a source, a header, a program or a benchmark reads the
# environment itself.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
check="$here/scripts/check_env_reads.py"
python3 "$check" --root "$here"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/core" "$tmp/src/ops"
printf 'const char* v = std::getenv("TRIAX_X");\n' > "$tmp/src/core/env.cpp"             # the one reader
printf '// std::getenv("X") in a comment, and "getenv(" in a string\nauto s = "getenv(";\n' > "$tmp/src/ops/gemm.cpp"
printf 'int v = env_int("TRIAX_X", 0, 9, 1);  // core/env.h\n' > "$tmp/src/ops/gelu.cpp"
python3 "$check" --root "$tmp" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }

. "$here/tests/house/refuse.sh"  # expect_refused FILE TEXT NEEDLE
expect_refused src/checkpoint/checkpoint.cpp '  if (const char* s = std::getenv("TRIAX_COMM_TIMEOUT_S")) return std::atoi(s);' \
  "src/checkpoint/checkpoint.cpp:1: reads the environment directly (getenv)"
expect_refused include/triax/core/log.h 'inline const char* f() { return ::secure_getenv ("X"); }' \
  "include/triax/core/log.h:1: reads the environment directly (secure_getenv)"
expect_refused examples/gpt_eval/main.cpp 'x = getenv("OMPI_COMM_WORLD_SIZE");' "examples/gpt_eval/main.cpp:1:"
expect_refused benchmarks/train_bench.cpp 'if (!std::getenv("OMP_NUM_THREADS")) {}' "benchmarks/train_bench.cpp:1:"
expect_refused src/distributed/x.cpp 'extern char** environ;' "src/distributed/x.cpp:1: reads the environment directly (environ)"
expect_refused kernels/gelu.cu 'auto p = getenv("X");' "kernels/gelu.cu:1:"
echo "env reads test: ok"
