#!/usr/bin/env bash
# The one device run for a single-H200 machine of the 'cuda' image (nvcc 13, CMake, ninja,
# PyTorch; no MPI, fmt, OpenBLAS, Catch2, nlohmann-json, CLI11, toml++). In one go, well inside
# 8 minutes on 16 cores:
#   0. prints the machine (GPU, driver, nvcc, compilers, glibc);
#   1. unpacks the carried dependency bundle (benchmarks/device/bundle.sh) and finds NCCL in the
#      PyTorch environment's nvidia-nccl wheel;
#   2. configures and builds triax single-process (-DTRIAX_WITH_MPI=OFF) with the CUDA tests;
#   3. runs the kernel equivalence test (every kernel vs the CPU ops, outputs poisoned, one
#      "kernel ... rel_err ... ok|FAIL" line each), the other CUDA tests and the loss-scaler test;
#   4. if time is left, the kernel test under compute-sanitizer memcheck (out-of-bounds accesses);
#   5. the training benchmark, when benchmarks/device/train_h200.sh exists (not yet written).
# Logs go to $OUT (the device tool's return folder, at most 8 files) or <repo>/out/device:
# summary.txt, build.log, kernels.log, loss_scaler.log, nccl.log, memcheck.log (2 left for step 5).
# Exit status: 0 when every step that ran passed, 1 otherwise.
# Env: TRIAX_DEPS (bundle path), JOBS (build parallelism, default nproc), BUILD (build dir),
#      BUILD_TIMEOUT (seconds, default 300), SKIP_SANITIZER=1.
set -uo pipefail
t0=$(date +%s)
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$root/out/device}
mkdir -p "$out"
deps_tar=${TRIAX_DEPS:-$root/.deps/triax-deps.tar.xz}
deps=/tmp/triax-deps
build=${BUILD:-/tmp/triax-build-h200}
jobs=${JOBS:-$(nproc)}
arch=x86_64-linux-gnu
summary=$out/summary.txt
: > "$summary"
status=0
elapsed() { echo $(($(date +%s) - t0)); }
log() { echo "[run_h200 +$(elapsed)s] $*" | tee -a "$summary"; }
fail() {
  log "FAILED: $*"
  status=1
}

# ---- 0. the machine
log "repo $root, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$summary"
else
  log "no nvidia-smi (no GPU here: the tests will report 'skipped')"
fi
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { fail "no nvcc (looked in PATH and /usr/local/cuda/bin)"; exit 1; }
log "nvcc $nvcc: $("$nvcc" --version | grep -o 'release [0-9.]*')"
log "$(cmake --version | head -1); ninja $(ninja --version); $(g++ --version | head -1); $(ldd --version | head -1)"

# ---- 1. dependencies
[ -f "$deps_tar" ] || { fail "no dependency bundle at $deps_tar: run benchmarks/device/bundle.sh on the build machine and carry .deps"; exit 1; }
rm -rf "$deps" && mkdir -p "$deps" && tar -C "$deps" -xJf "$deps_tar" || { fail "cannot unpack $deps_tar"; exit 1; }
log "bundle: $(head -1 "$deps/MANIFEST")"
export LD_LIBRARY_PATH=$deps/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NCCL: the library of the PyTorch environment's nvidia-nccl wheel; its header, or the bundled one.
nccl_args=()
py_nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
if [ -n "$py_nccl" ] && nccl_lib=$(find "$py_nccl" -name 'libnccl.so*' | sort | head -1) && [ -n "$nccl_lib" ]; then
  nroot=/tmp/triax-nccl
  rm -rf "$nroot" && mkdir -p "$nroot/include" "$nroot/lib"
  ln -s "$nccl_lib" "$nroot/lib/libnccl.so.2"
  ln -s "$nccl_lib" "$nroot/lib/libnccl.so"
  nccl_hdr=$(find "$py_nccl" -name nccl.h | head -1)
  cp "${nccl_hdr:-$deps/nccl/include/nccl.h}" "$nroot/include/nccl.h"
  log "NCCL: library $nccl_lib, header ${nccl_hdr:-bundled (the wheel has none)}"
  nccl_args=(-DNCCL_ROOT="$nroot")
  export LD_LIBRARY_PATH=$nroot/lib:$LD_LIBRARY_PATH
else
  log "NCCL: no nvidia.nccl in python3; CMake searches the CUDA toolkit and system paths"
fi

# ---- 2. configure and build (only what the device run needs)
d=$deps/usr
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTRIAX_WITH_MPI=OFF -DTRIAX_WITH_CUDA=ON -DTRIAX_BUILD_EXAMPLES=OFF -DTRIAX_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_PREFIX_PATH="$d" "${nccl_args[@]}" \
  -Dfmt_DIR="$d/lib/$arch/cmake/fmt" -DCatch2_DIR="$d/lib/cmake/Catch2" \
  -Dnlohmann_json_DIR="$d/share/cmake/nlohmann_json" -DCLI11_DIR="$d/share/cmake/CLI11" \
  -Dtomlplusplus_DIR="$d/lib/$arch/cmake/tomlplusplus" \
  -DBLAS_openblas_LIBRARY="$d/lib/$arch/libopenblas.so" -DTRIAX_CBLAS_INCLUDE_DIR="$d/include/$arch/openblas-pthread" \
  > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; fail "configure (log: build.log)"; exit 1; }
grep -E "^-- triax" "$out/build.log" | tee -a "$summary"
targets=(test_loss_scaler cuda_test_kernels)
for t in cuda_test_nccl_comm cuda_test_nccl_abort; do
  ninja -C "$build" -t targets all 2>/dev/null | grep -q "^$t:" && targets+=("$t")
done
log "building ${targets[*]} with $jobs jobs"
timeout "${BUILD_TIMEOUT:-300}" cmake --build "$build" -j "$jobs" --target "${targets[@]}" >> "$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; fail "build (log: build.log)"; exit 1; }
log "built"

# ---- 3. tests
"$build/tests/test_loss_scaler" > "$out/loss_scaler.log" 2>&1 || fail "test_loss_scaler (log: loss_scaler.log)"
log "loss scaler: $(grep -v '^$' "$out/loss_scaler.log" | tail -1)"
timeout 150 "$build/tests/cuda_test_kernels" > "$out/kernels.log" 2>&1
rc=$?
grep -E "^(kernel |test seed|skipped)" "$out/kernels.log" | tee -a "$summary"
tail -3 "$out/kernels.log" | tee -a "$summary"
case $rc in
  0) log "kernel equivalence: all passed" ;;
  77) log "kernel equivalence: SKIPPED (no GPU)" ;;
  124) fail "kernel equivalence timed out (log: kernels.log)" ;;
  *) fail "kernel equivalence rc=$rc (log: kernels.log)" ;;
esac
for t in "${targets[@]}"; do
  case $t in cuda_test_nccl_*)
    echo "==== $t" >> "$out/nccl.log"
    timeout 60 "$build/tests/$t" >> "$out/nccl.log" 2>&1
    rc=$?
    log "$t: rc=$rc ($(grep -v '^$' "$out/nccl.log" | tail -1))"
    [ $rc = 0 ] || [ $rc = 77 ] || fail "$t (log: nccl.log)"
  esac
done

# ---- 4. memory checker on the kernels, if there is time (compute-sanitizer works on Firecracker)
san=$(command -v compute-sanitizer || ls "$(dirname "$nvcc")/compute-sanitizer" \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ "${SKIP_SANITIZER:-0}" != 1 ] && [ -n "$san" ] && [ "$(elapsed)" -lt 330 ]; then
  timeout $((460 - $(elapsed))) "$san" --tool memcheck --error-exitcode 99 "$build/tests/cuda_test_kernels" \
    "[attention],[embedding],[layernorm],[xent],[gelu],[adamw],[grad_norm]" > "$out/memcheck.log" 2>&1
  rc=$?
  log "compute-sanitizer memcheck: rc=$rc ($(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1))"
  [ $rc = 0 ] || [ $rc = 124 ] || fail "memcheck (log: memcheck.log)"
else
  log "compute-sanitizer: not run (skipped, absent, or past 330 s)"
fi

# ---- 5. training benchmark (GPT-2 124M on one GPU vs PyTorch), once it exists
if [ -x "$root/benchmarks/device/train_h200.sh" ] && [ "$(elapsed)" -lt 420 ]; then
  BUILD=$build OUT=$out timeout $((470 - $(elapsed))) "$root/benchmarks/device/train_h200.sh" || fail "train_h200.sh"
elif [ -x "$root/benchmarks/device/train_h200.sh" ]; then
  fail "no time left for train_h200.sh ($(elapsed) s elapsed)"
else
  log "training benchmark: benchmarks/device/train_h200.sh does not exist yet (the GPU training path is not built)"
fi

log "done in $(elapsed) s, status $status"
exit $status
