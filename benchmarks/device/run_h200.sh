#!/usr/bin/env bash
# The one device run for a single-H200 machine of the 'cuda' image (nvcc 13, CMake, ninja, g++,
# PyTorch with its nvidia-nccl wheel; no MPI, fmt, OpenBLAS, OpenSSL headers, Catch2,
# nlohmann-json, CLI11, toml++, cpp-httplib; no network). One call, aimed at under 8 minutes on 16
# cores (README.md beside this says how to call it):
#   machine    GPU, driver, nvcc, CMake, g++, glibc
#   deps       unpacks the carried bundle (.deps/triax-deps.tar.xz, made by bundle.sh); NCCL from
#              the PyTorch environment's nvidia-nccl wheel
#   configure  -DTRIAX_WITH_MPI=OFF -DTRIAX_WITH_CUDA=ON -DTRIAX_WITH_HTTP=OFF, every dependency
#              pinned to the bundle, the system prefixes ignored
#   build      only what the run needs: the CUDA tests, test_loss_scaler, cuda_step_check,
#              train_gpt, triax-plan (those that exist)
#   kernels    1. every CUDA test (ctest label cuda: the kernel/op table against the CPU ops, one
#              "... ok|FAIL" line per op and type) and the loss-scaler test
#   cp_blocks  1b. timing of the context-parallel attention blocks one rank runs vs the
#              whole-sequence kernel (cuda_test_attention_block "[bench]", seq 4096..16384, cp 2, 4)
#   step_check 2. one fp32 training step of a small GPT, --backend cuda vs cpu (cuda_step_check),
#              then the same for llama-tiny (step_check_llama)
#   memcheck   4. compute-sanitizer memcheck of the small step (cuda_step_check, else the kernels)
#   gpt2       3. bf16 GPT-2 124M, 50 steps, triax vs PyTorch eager and torch.compile, MFU, memory
#              vs the planner (gpt2_h200.py), with the time that is left
# Every step has its own timeout and a place in $OUT/summary.json (status, seconds, numbers).
# Exit 0 when every step that ran passed ("missing" steps: their program does not exist yet).
#
#   run_h200.sh                 the device run
#   run_h200.sh --rehearse      HERE, no GPU: makes the bundle (bundle.sh), configures with the
#                               device image's missing libraries absent, builds the same targets,
#                               checks that every header and library came from the bundle, runs
#                               what needs no GPU (the CUDA tests report skipped; step 3's inputs,
#                               planner and a 2-step CPU comparison), prints the GPU commands.
#   run_h200.sh --rehearse=lib  the same up to the library only (ctest device.rehearse_lib)
# Env: OUT (default <repo>/out/device or out/rehearse), WORK (scratch: deps, build, data; default
#      /tmp/triax-device, rehearsal <repo>/build-rehearse), TRIAX_DEPS_DIR (<repo>/.deps) or
#      TRIAX_DEPS (the bundle file), BUILD, JOBS,
#      BUDGET_S (the whole run, default 470; rehearsal 7200), BUILD_TIMEOUT (300; 5400), SKIP_SANITIZER=1, GPT2_STEPS (50),
#      GPT2_BATCH (16), GPT2_SEQ (1024), TRIAX_TEST_SEED (replays a kernel-test seed).
set -uo pipefail
t0=$(date +%s)
mode=device lib_only=0
case "${1:-}" in
  "") ;;
  --rehearse) mode=rehearse ;;
  --rehearse=lib) mode=rehearse lib_only=1 ;;
  -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
  *) echo "run_h200.sh: unknown argument '$1' (--rehearse, --rehearse=lib, --help)" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ $mode = rehearse ]; then
  out=${OUT:-$root/out/rehearse} work=${WORK:-$root/build-rehearse}
else
  out=${OUT:-$root/out/device} work=${WORK:-/tmp/triax-device}
fi
mkdir -p "$out" "$work"
# The bundle: $TRIAX_DEPS, else triax-deps.tar.xz (or .gz) in $TRIAX_DEPS_DIR (default <repo>/.deps).
deps_dir=${TRIAX_DEPS_DIR:-$root/.deps}
deps_tar=${TRIAX_DEPS:-}
deps=$work/deps
build=${BUILD:-$work/build}
jobs=${JOBS:-$(nproc)}
# The device run's whole budget and the build's share; the rehearsal (2 shared cores) gets hours.
if [ $mode = rehearse ]; then budget=${BUDGET_S:-7200} build_timeout=${BUILD_TIMEOUT:-5400}
else budget=${BUDGET_S:-470} build_timeout=${BUILD_TIMEOUT:-300}; fi
arch=x86_64-linux-gnu
summary=$out/summary.txt records=$work/steps.jsonl
: > "$summary"
: > "$records"
rm -f "$out/summary.json"
# A Python with numpy (step 3, the summary): the image's python3; here Debian's if pyenv's has none.
py=python3
python3 -c 'import numpy' 2>/dev/null || { [ -x /usr/bin/python3 ] && py=/usr/bin/python3; }

elapsed() { echo $(($(date +%s) - t0)); }
log() { echo "[run_h200 +$(elapsed)s] $*" | tee -a "$summary"; }
# record NAME STATUS START_S [summary.py options]: one step's record in summary.json.
record() {
  local name=$1 st=$2 start=$3
  shift 3
  "$py" "$here/summary.py" step "$records" "$out" "$name" "$st" $(($(date +%s) - start)) "$@" ||
    log "summary.py failed on step $name"
  log "step $name: $st"
}
# left NEED: the seconds left of the budget, or nothing (and 1) when fewer than NEED are left.
left() {
  local l=$((budget - $(elapsed)))
  [ "$l" -ge "$1" ] && echo "$l"
}
# cap SECONDS: the step's own timeout, shortened to what the budget leaves.
cap() {
  local l=$((budget - $(elapsed)))
  echo $(($1 < l ? $1 : (l > 1 ? l : 1)))
}
# status_of RC: passed | skipped (77: no GPU; a failure on the device, where there must be one) |
# timeout (124, 137) | failed
status_of() {
  case $1 in
    0) echo passed ;;
    77) if [ $mode = rehearse ]; then echo skipped; else echo failed; fi ;;
    124|137) echo timeout ;;
    *) echo failed ;;
  esac
}
finish() {
  "$py" "$here/summary.py" finish "$records" "$out" --mode $mode --wall "$(elapsed)" | tee -a "$summary"
  exit "${PIPESTATUS[0]}"
}
# have_target NAME: whether the configured tree has that target (the list is read once: grep -q
# on ninja's pipe would end ninja early, and pipefail then says "no" for an early name).
have_target() {
  [ -n "${all_targets:-}" ] || all_targets=$(ninja -C "$build" -t targets all 2>/dev/null)
  grep -q "^$1:" <<< "$all_targets"
}

# ---- machine
s=$(date +%s)
log "mode $mode; repo $root, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'); out $out; work $work"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | head -1)
else
  gpu="none (no nvidia-smi or no device)"
fi
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { log "no nvcc (looked in PATH and /usr/local/cuda/bin)"; record machine failed "$s" --detail "no nvcc"; finish; }
machine="GPU $gpu; nvcc $("$nvcc" --version | grep -o 'release [0-9.]*'); $(cmake --version | head -1); ninja $(ninja --version); $(g++ --version | head -1); $(ldd --version | head -1); $(nproc) cores"
log "$machine"
record machine info "$s" --detail "$machine"

# ---- bundle (rehearsal only: the device run carries it)
if [ $mode = rehearse ]; then
  s=$(date +%s)
  if "$here/bundle.sh" "${deps_tar:+$(dirname "$deps_tar")}${deps_tar:-$deps_dir}" > "$work/bundle.log" 2>&1; then
    b=$(grep -E '^bundle.sh: ' "$work/bundle.log" | tr '\n' ' ')
    log "$b"
    record bundle passed "$s" --detail "$b"
  else
    cat "$work/bundle.log"
    record bundle failed "$s" --log bundle.log --detail "bundle.sh failed"
    finish
  fi
fi

# ---- deps: the bundle, NCCL
s=$(date +%s)
if [ -z "$deps_tar" ]; then
  deps_tar=$deps_dir/triax-deps.tar.xz
  [ -f "$deps_tar" ] || [ ! -f "$deps_dir/triax-deps.tar.gz" ] || deps_tar=$deps_dir/triax-deps.tar.gz
fi
[ -f "$deps_tar" ] || { log "no dependency bundle at $deps_tar: run benchmarks/device/bundle.sh on the build machine and carry .deps"; record deps failed "$s" --detail "no bundle"; finish; }
rm -rf "$deps" && mkdir -p "$deps" && tar -C "$deps" -xf "$deps_tar" || { record deps failed "$s" --detail "cannot unpack $deps_tar"; finish; }
log "bundle: $(head -1 "$deps/MANIFEST"), $(du -h "$deps_tar" | cut -f1)"
# For triax's programs (libopenblas needs the bundled libgfortran); gpt2_h200.py takes
# TRIAX_DEPS_LIB out again for the PyTorch processes.
export TRIAX_DEPS_LIB=$deps/usr/lib/$arch
export LD_LIBRARY_PATH=$TRIAX_DEPS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NCCL: the library of the PyTorch environment's nvidia-nccl wheel; its header, or the bundled one.
nccl_args=()
py_nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
if [ -n "$py_nccl" ] && nccl_lib=$(find "$py_nccl" -name 'libnccl.so*' | sort | head -1) && [ -n "$nccl_lib" ]; then
  nroot=$work/nccl
  rm -rf "$nroot" && mkdir -p "$nroot/include" "$nroot/lib"
  ln -s "$nccl_lib" "$nroot/lib/libnccl.so.2"
  ln -s "$nccl_lib" "$nroot/lib/libnccl.so"
  nccl_hdr=$(find "$py_nccl" -name nccl.h | head -1)
  cp "${nccl_hdr:-$deps/nccl/include/nccl.h}" "$nroot/include/nccl.h"
  nccl_note="library $nccl_lib, header ${nccl_hdr:-bundled (the wheel has none)}"
  nccl_args=(-DNCCL_ROOT="$nroot")
  export LD_LIBRARY_PATH=$nroot/lib:$LD_LIBRARY_PATH
else
  nccl_note="no nvidia.nccl in python3: CMake searches the CUDA toolkit"
fi
log "NCCL: $nccl_note"
record deps passed "$s" --detail "$(head -1 "$deps/MANIFEST" | sed 's/^# //'); NCCL: $nccl_note"

# ---- configure: every dependency from the bundle; /usr and / are not searched (a dependency the
# bundle lacks fails here, as it would on the image), Gloo, MPI and cpp-httplib are off. sm_90
# only; CUDA warnings are not errors here (CI holds that line; another g++ on the image must not
# cost a device run).
s=$(date +%s)
d=$deps/usr
cuda=ON
[ $mode = rehearse ] && cuda=${REHEARSE_CUDA:-ON}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTRIAX_WITH_MPI=OFF -DTRIAX_WITH_CUDA=$cuda -DTRIAX_CUDA_ARCHITECTURES=90 -DTRIAX_CUDA_WERROR=OFF -DTRIAX_WITH_HTTP=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON \
  -DCMAKE_IGNORE_PREFIX_PATH="/usr;/" -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_PREFIX_PATH="$d" "${nccl_args[@]}" \
  -Dfmt_DIR="$d/lib/$arch/cmake/fmt" -DCatch2_DIR="$d/lib/cmake/Catch2" \
  -Dnlohmann_json_DIR="$d/share/cmake/nlohmann_json" -DCLI11_DIR="$d/share/cmake/CLI11" \
  -Dtomlplusplus_DIR="$d/lib/$arch/cmake/tomlplusplus" \
  -DTRIAX_OPENBLAS_OPENMP="$d/lib/$arch/libopenblas.so" -DTRIAX_CBLAS_INCLUDE_DIR="$d/include/openblas" \
  -DOPENSSL_ROOT_DIR="$d" -DOPENSSL_INCLUDE_DIR="$d/include" -DOPENSSL_CRYPTO_LIBRARY="$d/lib/$arch/libcrypto.so" \
  > "$out/build.log" 2>&1
rc=$?
if [ $rc != 0 ]; then
  tail -30 "$out/build.log"
  record configure failed "$s" --rc $rc --log build.log
  finish
fi
triax_line=$(grep -E "^-- triax: MPI" "$out/build.log" | tail -1)
for l in "$(grep -E "^-- triax: HTTP" "$out/build.log" | tail -1)" "$(grep -E "^-- triax: cuDNN attention" "$out/build.log" | tail -1)"; do
  [ -n "$l" ] && triax_line="$triax_line; ${l#-- triax: }"
done
log "$triax_line"
record configure passed "$s" --log build.log --detail "${triax_line#-- }"

# ---- build: only what the run needs, with its own timeout
s=$(date +%s)
if [ $lib_only = 1 ]; then
  targets=(triax test_metrics_textfile)
else
  targets=(test_loss_scaler)
  [ $mode = rehearse ] && targets+=(test_metrics_textfile)
  have_target triax
  for t in $(grep -oE '^cuda_test_[A-Za-z0-9_]+:' <<< "$all_targets" | tr -d :) cuda_step_check train_gpt triax-plan; do
    have_target "$t" && targets+=("$t")
  done
fi
log "building ${targets[*]} with $jobs jobs"
timeout "$(cap "$build_timeout")" cmake --build "$build" -j "$jobs" --target "${targets[@]}" >> "$out/build.log" 2>&1
rc=$?
if [ $rc != 0 ]; then
  tail -40 "$out/build.log"
  record build "$(status_of $rc)" "$s" --rc $rc --log build.log --detail "targets: ${targets[*]}"
  finish
fi
record build passed "$s" --log build.log --detail "targets: ${targets[*]} ($jobs jobs)"

# ---- (rehearsal) every header and shared library of the bundle's packages came from the bundle
if [ $mode = rehearse ]; then
  s=$(date +%s)
  bad=$(ninja -C "$build" -t deps 2>/dev/null |
        grep -E '^ +/usr/include/(fmt|nlohmann|toml\+\+|catch2|CLI|openssl|x86_64-linux-gnu/(openssl|openblas)|httplib|gloo|mpi|infiniband)' |
        sort -u | head -5)
  libs=$(find "$build" -maxdepth 3 -type f -executable \( -name 'cuda_test_*' -o -name train_gpt -o -name triax-plan -o -name 'test_*' \) |
         head -20 | xargs -r ldd 2>/dev/null |
         grep -E 'lib(fmt|openblas|tomlplusplus|crypto|gfortran|cpp-httplib|mpi|gloo|ibverbs)' | grep -v "$deps" | sort -u | head -5)
  # What the link lines name: no bundled package's library from the system (-lfoo or a path).
  links=$(ninja -C "$build" -t commands "${targets[@]}" 2>/dev/null | tr ' ' '\n' |
          grep -E '(^/usr/lib/.*/?lib(fmt|openblas|tomlplusplus|crypto|ssl|gfortran|cpp-httplib|mpi|gloo|ibverbs)[.-]|^-l(fmt|openblas|tomlplusplus|crypto|ssl|gfortran|cpp-httplib|mpi|gloo|ibverbs)$)' |
          sort -u | head -5)
  bad="$bad $links"
  bad=${bad# }
  # (ccache with CCACHE_BASEDIR writes paths under it relative: count both spellings)
  from=$(ninja -C "$build" -t deps 2>/dev/null | grep -cE "^ +(/|\.\./)([^ ]*/)?deps/usr/")
  if [ -z "$bad$libs" ]; then
    record isolation passed "$s" --detail "$from header uses from the bundle, none of its packages' headers from /usr/include, no system copy of its libraries on a link line or in ldd"
  else
    log "from the system instead of the bundle: $bad $libs"
    record isolation failed "$s" --detail "from the system: $(echo $bad $libs | head -c 400)"
  fi
fi
# ---- (rehearsal) the build without cpp-httplib refuses --metrics-port and keeps the textfile
if [ $mode = rehearse ]; then
  s=$(date +%s)
  "$build/tests/test_metrics_textfile" > "$work/no_http.log" 2>&1
  rc=$?
  record no_http "$(status_of $rc)" "$s" --rc $rc --detail "test_metrics_textfile (HTTP=OFF): $(grep -E 'passed|failed' "$work/no_http.log" | tail -1)"
fi
[ $lib_only = 1 ] && finish

# ---- 1. the CUDA tests (the kernel/op table) and the loss-scaler test
s=$(date +%s)
tlog=$out/tests.log
: > "$tlog"
"$build/tests/test_loss_scaler" >> "$tlog" 2>&1
ls_rc=$?
worst=0 ran=0 skipped=0 failed_tests=()
for t in "${targets[@]}"; do
  case $t in cuda_test_*) ;; *) continue ;; esac
  l=$(left 20) || { record kernels no_time "$s" --log tests.log --detail "$(elapsed) s gone before $t"; break; }
  echo "==== $t" >> "$tlog"
  timeout "$(cap 150)" "$build/tests/$t" >> "$tlog" 2>&1
  rc=$?
  ran=$((ran + 1))
  log "$t: rc=$rc ($(grep -v '^$' "$tlog" | tail -1 | head -c 160))"
  case $rc in
    0) ;;
    77) skipped=$((skipped + 1)); [ $mode = device ] && failed_tests+=("$t:77(no GPU seen)") ;;
    *) failed_tests+=("$t:$rc") ;;
  esac
done
# The op table: every line that ends in ok or FAIL (the kernel tests print one per op and type).
grep -E '(^| )(ok|FAIL)$' "$tlog" > "$work/op_table.txt"
n_ok=$(grep -cE ' ok$' "$work/op_table.txt") n_fail=$(grep -cE ' FAIL$' "$work/op_table.txt")
cat "$work/op_table.txt" | tee -a "$summary" > /dev/null
"$py" -c 'import json,sys; print(json.dumps({"ops_ok": int(sys.argv[1]), "ops_fail": int(sys.argv[2]), "table": open(sys.argv[3]).read().splitlines(), "loss_scaler_rc": int(sys.argv[4])}))' \
  "$n_ok" "$n_fail" "$work/op_table.txt" "$ls_rc" > "$work/kernels.json"
detail="$ran CUDA tests, $skipped skipped (no GPU), failed: ${failed_tests[*]:-none}; op table $n_ok ok, $n_fail FAIL; loss scaler rc $ls_rc"
if ! grep -q '"name": "kernels"' "$records" 2>/dev/null; then
  if [ ${#failed_tests[@]} -gt 0 ] || [ "$n_fail" -gt 0 ] || [ $ls_rc != 0 ]; then st=failed
  elif [ $ran = 0 ]; then st=missing
  elif [ $skipped = $ran ]; then st=skipped
  else st=passed; fi
  record kernels $st "$s" --log tests.log --detail "$detail" --numbers "$work/kernels.json"
fi

# ---- 1b. context-parallel attention blocks: the blocks rank 0 runs (its queries against every
# rank's K/V, forward + backward) vs the whole-sequence CUDA kernel, fp32, seq 4096..16384 split
# over cp 2 and 4, alternating in one process (cuda_test_attention_block "[bench]"; its
# correctness lines, "cp_block ... ok|FAIL", are in step 1's op table). One line per shape:
# "cp_block_timing seq S cp N whole_ms W rank0_blocks_ms B ratio B/W ideal 1/N".
s=$(date +%s)
cpb=$build/tests/cuda_test_attention_block
if [ ! -x "$cpb" ]; then
  record cp_blocks missing "$s" --detail "no cuda_test_attention_block in this tree"
elif ! left 40 > /dev/null; then
  record cp_blocks no_time "$s"
else
  echo "==== cuda_test_attention_block [bench]" >> "$tlog"
  timeout "$(cap 60)" "$cpb" "[bench]" > "$work/cp_blocks.log" 2>&1
  rc=$?
  cat "$work/cp_blocks.log" >> "$tlog"
  grep -E '^cp_block_timing' "$work/cp_blocks.log" > "$work/cp_blocks.txt"
  tee -a "$summary" < "$work/cp_blocks.txt"
  "$py" -c 'import json,sys; print(json.dumps({"timing": open(sys.argv[1]).read().splitlines()}))' \
    "$work/cp_blocks.txt" > "$work/cp_blocks.json"
  record cp_blocks "$(status_of $rc)" "$s" --rc $rc --log tests.log --numbers "$work/cp_blocks.json" \
    --detail "$(tr '\n' ';' < "$work/cp_blocks.txt" | head -c 600)"
fi

# ---- 2. one fp32 step, --backend cuda vs cpu
s=$(date +%s)
step_exe=$(find "$build" -name cuda_step_check -type f -executable 2>/dev/null | head -1)
if [ -z "$step_exe" ]; then
  record step_check missing "$s" --detail "no cuda_step_check target in this tree"
elif ! left 30 > /dev/null; then
  record step_check no_time "$s"
else
  timeout "$(cap 120)" "$step_exe" > "$out/step_check.log" 2>&1
  rc=$?
  tail -15 "$out/step_check.log" | tee -a "$summary"
  record step_check "$(status_of $rc)" "$s" --rc $rc --log step_check.log --detail "$(grep -v '^$' "$out/step_check.log" | tail -1 | head -c 300)"
  # The Llama block (RMSNorm, SwiGLU, RoPE, untied head; 4 heads of 64 over llama-tiny's 2 KV
  # heads: the GQA kernels), the same check.
  s=$(date +%s)
  if left 30 > /dev/null; then
    timeout "$(cap 120)" "$step_exe" --model llama-tiny --hidden-size 256 --num-attention-heads 4 > "$out/step_check_llama.log" 2>&1
    rc=$?
    tail -15 "$out/step_check_llama.log" | tee -a "$summary"
    record step_check_llama "$(status_of $rc)" "$s" --rc $rc --log step_check_llama.log --detail "$(grep -v '^$' "$out/step_check_llama.log" | tail -1 | head -c 300)"
  else
    record step_check_llama no_time "$s"
  fi
fi

# ---- 4. compute-sanitizer memcheck of the small step (before step 3: it is short, and step 3
# takes whatever time is left)
s=$(date +%s)
san=$(command -v compute-sanitizer || ls "$(dirname "$nvcc")/compute-sanitizer" \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$step_exe" ]; then
  target_cmd=("$step_exe")
elif [ -x "$build/tests/cuda_test_kernels" ]; then
  target_cmd=("$build/tests/cuda_test_kernels" "[attention],[embedding],[layernorm],[xent],[gelu],[adamw],[grad_norm]")
else
  target_cmd=()
fi
if [ "${SKIP_SANITIZER:-0}" = 1 ]; then
  record memcheck skipped "$s" --detail "SKIP_SANITIZER=1"
elif [ $mode = rehearse ] && [ ${#target_cmd[@]} -gt 0 ]; then
  log "would run: ${san:-compute-sanitizer (not installed here)} --tool memcheck --error-exitcode 99 ${target_cmd[*]}"
  record memcheck rehearsed "$s" --detail "${san:-compute-sanitizer} --tool memcheck --error-exitcode 99 ${target_cmd[*]}"
elif [ -z "$san" ] || [ ${#target_cmd[@]} = 0 ]; then
  record memcheck missing "$s" --detail "compute-sanitizer: ${san:-absent}; program: ${target_cmd[*]:-none}"
elif ! left 30 > /dev/null; then
  record memcheck no_time "$s"
else
  timeout "$(cap 120)" "$san" --tool memcheck --error-exitcode 99 "${target_cmd[@]}" > "$out/memcheck.log" 2>&1
  rc=$?
  st=$(status_of $rc)
  [ $rc = 99 ] && st=failed
  record memcheck "$st" "$s" --rc $rc --log memcheck.log \
    --detail "$(basename "${target_cmd[0]}"): $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
fi

# ---- 3. bf16 GPT-2 124M vs PyTorch eager and torch.compile
s=$(date +%s)
g_args=(--build "$build" --work "$work/gpt2" --log "$out/gpt2.log" --result "$work/gpt2.json"
        --steps "${GPT2_STEPS:-50}" --batch "${GPT2_BATCH:-16}" --seq "${GPT2_SEQ:-1024}")
: > "$out/gpt2.log"
if [ $mode = rehearse ]; then
  timeout 900 "$py" "$here/gpt2_h200.py" "${g_args[@]}" --rehearse
  rc=$?
  st=$(status_of $rc)
  [ $rc = 77 ] && st=missing
  [ $rc = 0 ] && st=rehearsed
  record gpt2 $st "$s" --rc $rc --log gpt2.log --numbers "$work/gpt2.json" \
    --detail "$(grep -E '^(train_gpt --help|CPU fp32)' "$out/gpt2.log" | cut -c1-200 | tr '\n' ' '); GPU commands printed"
elif ! left 200 > /dev/null; then
  record gpt2 no_time "$s" --detail "$(elapsed) s gone; step 3 needs about 200"
else
  l=$(left 0)
  t_tx=$(( l * 30 / 100 )) t_eager=$(( l * 20 / 100 )) t_comp=$(( l * 35 / 100 ))
  timeout "$((l - 10))" "$py" "$here/gpt2_h200.py" "${g_args[@]}" \
    --timeout-triax $((t_tx > 150 ? 150 : t_tx)) --timeout-eager $((t_eager > 90 ? 90 : t_eager)) \
    --timeout-compile $((t_comp > 180 ? 180 : t_comp))
  rc=$?
  st=$(status_of $rc)
  [ $rc = 77 ] && st=missing
  detail=$(grep -E '^TARGET' "$out/gpt2.log" | sed 's/^TARGET //' | tr '\n' ';' | head -c 600)
  record gpt2 "$st" "$s" --rc $rc --log gpt2.log --numbers "$work/gpt2.json" \
    --detail "${detail:-$(grep -v '^$' "$out/gpt2.log" | tail -1 | head -c 300)}"
fi
grep -E '^(TARGET|  *side|  *triax|  *torch)' "$out/gpt2.log" >> "$summary" 2>/dev/null

finish
