#!/usr/bin/env bash
# Overhead of the flight recorder and the watchdog on the main job's tokens/s (README: 8 ranks,
# tp 2 x pp 2 x dp 2). Rounds alternate off/on in one run, so machine drift hits both alike;
# prints each round's median tokens/s (iterations 3..N) and the on/off ratio. Then the cost
# model: communicator calls per iteration (from an exit dump) x the recorder's cost per call
# (flight_recorder_bench), as a share of the measured iteration time.
#   benchmarks/fault_overhead.sh BUILD_DIR [ROUNDS] [ITERS]
# off: TRIAX_FR_SIZE=0 (no ring) and no --stall-timeout; on: the default 2048-call ring per
# communicator and --stall-timeout 600.
set -euo pipefail
build=$(realpath "$1"); rounds=${2:-5}; iters=${3:-20}
exe=$build/examples/train_gpt/train_gpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(--tp 2 --pp 2 --dp 2 --train-iters "$iters")
median_tps() { python3 -c "
import json,sys,statistics
r=[json.loads(l)['tokens_per_s'] for l in open(sys.argv[1])][2:]
print(statistics.median(r))" "$1"; }
printf "round  off_tokens/s  on_tokens/s  on/off\n"
ratios=()
for ((i = 1; i <= rounds; ++i)); do
  (cd "$tmp" && mpirun --oversubscribe -np 8 -x TRIAX_FR_SIZE=0 "$exe" "${args[@]}" --metrics-jsonl off.jsonl >/dev/null 2>&1)
  (cd "$tmp" && mpirun --oversubscribe -np 8 -x TRIAX_FR_DUMP_ON_EXIT=1 "$exe" "${args[@]}" --stall-timeout 600 \
     --metrics-jsonl on.jsonl >/dev/null 2>&1)
  off=$(median_tps "$tmp/off.jsonl"); on=$(median_tps "$tmp/on.jsonl")
  ratios+=("$(python3 -c "print($on/$off)")")
  python3 -c "print(f'{$i:5d}  {$off:12.0f}  {$on:11.0f}  {$on/$off:6.3f}')"
done
python3 -c "import statistics,sys; print(f'median on/off: {statistics.median(map(float, sys.argv[1:])):.3f}')" "${ratios[@]}"
ns=$("$build/benchmarks/flight_recorder_bench" --rounds 5 | awk '/median recorder cost/ { print $4 }')
python3 - "$tmp" "$iters" "$ns" <<'PY'
import json, statistics, sys, glob
tmp, iters, ns = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
calls = max(sum(g["calls"][-1]["seq"] + 1 for g in json.load(open(f))["groups"] if g["calls"])
            for f in glob.glob(f"{tmp}/triax_fr_rank*.json")) / iters
ms = statistics.median(json.loads(l)["elapsed_ms"] for l in open(f"{tmp}/on.jsonl"))
print(f"cost model: {calls:.0f} calls per iteration x {ns:.0f} ns = {calls * ns / 1e3:.1f} us of a "
      f"{ms:.0f} ms iteration = {calls * ns / 1e6 / ms * 100:.4f} %")
PY
