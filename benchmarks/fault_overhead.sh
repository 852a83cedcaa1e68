#!/usr/bin/env bash
# Overhead of the flight recorder and the watchdog on the main job's tokens/s (README: 8 ranks,
# tp 2 x pp 2 x dp 2). Rounds alternate off/on in one run, so machine drift hits both alike;
# prints each round's median tokens/s (iterations 3..N) and the on/off ratio.
#   benchmarks/fault_overhead.sh TRAIN_GPT [ROUNDS] [ITERS]
# off: TRIAX_FR_SIZE=0 (no ring) and no --stall-timeout; on: the default 2048-call ring per
# communicator and --stall-timeout 600.
set -euo pipefail
exe=$(realpath "$1"); rounds=${2:-5}; iters=${3:-20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(--tp 2 --pp 2 --dp 2 --train-iters "$iters")
median_tps() { python3 -c "
import json,sys,statistics
r=[json.loads(l)['tokens_per_s'] for l in open(sys.argv[1])][2:]
print(statistics.median(r))" "$1"; }
printf "round  off_tokens/s  on_tokens/s  on/off\n"
for ((i = 1; i <= rounds; ++i)); do
  (cd "$tmp" && mpirun --oversubscribe -np 8 -x TRIAX_FR_SIZE=0 "$exe" "${args[@]}" --metrics-jsonl off.jsonl >/dev/null 2>&1)
  (cd "$tmp" && mpirun --oversubscribe -np 8 "$exe" "${args[@]}" --stall-timeout 600 --metrics-jsonl on.jsonl >/dev/null 2>&1)
  off=$(median_tps "$tmp/off.jsonl"); on=$(median_tps "$tmp/on.jsonl")
  python3 -c "print(f'{$i:5d}  {$off:12.0f}  {$on:11.0f}  {$on/$off:6.3f}')"
done
