#!/usr/bin/env bash
# tests/het_bench.cmake: train_bench as the calibrator of a device class and as the timer of a
# two-class MPMD launch (benchmarks/hetero_cpu.sh does both at full size).
#   check.sh calibrate MPIEXEC TRAIN_BENCH TRIAX_PLAN WORKDIR
#   check.sh fit       MPIEXEC TRAIN_BENCH WORKDIR
#   check.sh mpmd      MPIEXEC TRAIN_BENCH WORKDIR [TRAIN_BENCH_FLAGS...]
set -euo pipefail
mode=$1 mpiexec=$2 tb=$3
small=(--layers 2 --hidden 64 --heads 2 --seq 32 --micro-batch-size 2 --global-batch-size 8 --iters 2 --warmup 1
       --overlap on)
fail() { echo "FAIL: $*"; exit 1; }

if [[ $mode == fit ]]; then
  dir=$4
  rm -rf "$dir" && mkdir -p "$dir"
  # --fit-step: the file's compute rates are the kernels' times the planner's compute over the step's
  # measured compute CPU time (both in the JSON); the link stays as measured.
  "$mpiexec" --oversubscribe --bind-to none -np 2 "$tb" "${small[@]}" --predict --calibration-seconds 0.1 --label fit \
    --fit-step --json "$dir/run.json" --write-cluster "$dir/fit.toml" | tee "$dir/out.txt"
  grep -q "^fit-step: compute rates x [0-9.]* (predicted" "$dir/out.txt" || fail "no fit-step line"
  python3 - "$dir/run.json" "$dir/fit.toml" <<'PY'
import json, sys, tomllib
j = json.load(open(sys.argv[1]))
t = tomllib.load(open(sys.argv[2], "rb"))
k = j["overlap"]["predicted_compute_tp"] / j["overlap"]["measured_compute_cpu"]
assert abs(j["fit_step"] - k) <= 1e-9 * k, (j["fit_step"], k)
c = j["calibration"]
for got, base, what in ((t["compute"]["peak_tflops_fp32"] * 1e3, c["gemm_gflops_cpu"], "peak"),
                        (t["memory"]["bandwidth_gbps"], c["elementwise_gbps_cpu"], "memory"),
                        (t["memory"]["copy_gbps"], c["copy_gbps_cpu"], "copies")):
    assert abs(got - k * base) <= 1e-9 * got, (what, got, k * base)
assert abs(t["compute"]["attention_efficiency"] - c["attention_efficiency"]) <= 1e-12
print(f"fit-step file: rates x {k:.3f} = predicted / measured compute of the run")
PY
  # Refused where there is no even layout of flags to fit to, and without --write-cluster.
  if "$mpiexec" --oversubscribe -np 2 "$tb" "${small[@]}" --predict --fit-step >"$dir/bad.txt" 2>&1; then
    fail "--fit-step without --write-cluster was accepted"
  fi
  grep -q "fit-step needs --write-cluster" "$dir/bad.txt" || { cat "$dir/bad.txt"; fail "no message for --fit-step alone"; }
  exit 0
fi

if [[ $mode == calibrate ]]; then
  plan=$4 dir=$5
  rm -rf "$dir" && mkdir -p "$dir"
  # Both ranks of the class; --write-cluster reads the file back itself (IoError if it differs).
  "$mpiexec" --oversubscribe --bind-to none -np 2 -x TRIAX_DEVICE_CLASS=probe "$tb" "${small[@]}" --predict \
    --calibration-seconds 0.1 --label probe --json "$dir/run.json" --write-cluster "$dir/probe.toml" | tee "$dir/out.txt"
  grep -q "wrote $dir/probe.toml: the calibrated cluster .* read back equal" "$dir/out.txt" || fail "no 'wrote' line"
  # The file holds the calibrated numbers of the JSON (independently of the C++ reader).
  python3 - "$dir/run.json" "$dir/probe.toml" <<'PY'
import json, sys, tomllib
j = json.load(open(sys.argv[1]))["calibration"]
t = tomllib.load(open(sys.argv[2], "rb"))
def near(a, b, what):
    if abs(a - b) > 1e-9 * max(abs(a), abs(b)): sys.exit(f"FAIL: {what}: file {a} != measured {b}")
near(t["compute"]["peak_tflops_fp32"] * 1e3, j["gemm_gflops_cpu"], "peak_tflops_fp32")
near(t["memory"]["bandwidth_gbps"], j["elementwise_gbps_cpu"], "memory.bandwidth_gbps")
near(t["memory"]["copy_gbps"], j["copy_gbps_cpu"], "memory.copy_gbps")
near(t["compute"]["attention_efficiency"], j["attention_efficiency"], "attention_efficiency")
near(t["intra_node"]["latency_us"], j["allreduce_alpha_us"], "intra_node.latency_us")
near(t["intra_node"]["bandwidth_gbps"], j["allreduce_busbw_gbps"], "intra_node.bandwidth_gbps")
if t["node"]["devices"] != 2 or t["name"] != "probe": sys.exit(f"FAIL: node/name {t['node']} {t['name']}")
print("calibrated cluster file matches the run's measurements")
PY
  # The planner reads it and prices a layout on it.
  "$plan" --cluster "$dir/probe.toml" --layers 2 --hidden 64 --heads 2 --seq 32 --vocab 256 --global-batch 8 \
    --precision fp32 --runtime-copies --tp 1 --pp 1 --dp 2 --mbs 2 --json > "$dir/plan.json"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['cluster']=='probe' and d['seconds_per_iteration']>0, d; print('triax-plan priced a layout on it:', d['seconds_per_iteration'], 's')" "$dir/plan.json"
  exit 0
fi

if [[ $mode == mpmd ]]; then
  dir=$4; shift 4
  rm -rf "$dir" && mkdir -p "$dir"
  # One rank per class; the slow class runs OpenBLAS's Core2 kernels (ignored by a non-DYNAMIC_ARCH BLAS:
  # nothing here asserts speed).
  if ! "$mpiexec" --oversubscribe --bind-to none \
    -np 1 -x TRIAX_DEVICE_CLASS=fast "$tb" "${small[@]}" "$@" : \
    -np 1 -x TRIAX_DEVICE_CLASS=slow -x OPENBLAS_CORETYPE=Core2 "$tb" "${small[@]}" "$@" > "$dir/mixed.txt" 2>&1; then
    cat "$dir/mixed.txt"
    # Skipped (ctest SKIP_RETURN_CODE), not passed, while the trainer lacks the heterogeneous options.
    grep -q "this build's trainer has no option" "$dir/mixed.txt" && exit 77
    fail "the two-class run failed"
  fi
  cat "$dir/mixed.txt"
  "$mpiexec" --oversubscribe --bind-to none -np 2 "$tb" "${small[@]}" --dp 2 | tee "$dir/even.txt"
  python3 - "$dir/mixed.txt" "$dir/even.txt" <<'PY'
import json, sys
def result(path):
    lines = [l for l in open(path) if l.startswith("train_bench_result ")]
    if len(lines) != 1: sys.exit(f"FAIL: {path}: {len(lines)} train_bench_result lines")
    return json.loads(lines[0].split(" ", 1)[1])
m, e = result(sys.argv[1]), result(sys.argv[2])
c = m["classes"]
if sorted(c) != ["fast", "slow"] or c["fast"]["ranks"] != [0] or c["slow"]["ranks"] != [1]:
    sys.exit(f"FAIL: classes {c}")
if not all(c[k]["compute_ms"] > 0 for k in c) or not m["step_ms"] > 0: sys.exit(f"FAIL: times {m}")
# The same model, data and global batch: the losses agree with the one-class run up to float
# rounding (a different GEMM kernel and, with uneven shares, another summation order).
for a, b in zip(m["losses"], e["losses"]):
    if abs(a - b) > 1e-5 * abs(b): sys.exit(f"FAIL: losses {m['losses']} vs one class {e['losses']}")
print("two-class run: classes", {k: round(v["compute_ms"], 1) for k, v in c.items()}, "ms compute; losses agree")
PY
  exit 0
fi
fail "unknown mode $mode"
