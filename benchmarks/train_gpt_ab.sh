#!/usr/bin/env bash
# Alternating A/B rounds of train_gpt: tokens/s (wall, mean over iterations 2..) and the CPU
# seconds of the whole run (user+sys of mpirun and its ranks), before (A) and after (B).
# usage: benchmarks/train_gpt_ab.sh BEFORE/train_gpt AFTER/train_gpt ROUNDS NP train_gpt-args...
# BEFORE and AFTER are split at spaces, so either may be a command that sets a knob, e.g.
#   benchmarks/train_gpt_ab.sh "env TRIAX_COMM_SPIN_US=1000000 build/examples/train_gpt/train_gpt" \
#     build/examples/train_gpt/train_gpt 6 2 --dp 2
# The order alternates (A B, B A, ...) so the machine's drift hits both alike. Needs /usr/bin/time.
set -u
A=$1; B=$2; ROUNDS=$3; NP=$4; shift 4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
one() {  # prints "tokens/s cpu_s"
  local out; out=$( { /usr/bin/time -f 'CPU %U %S' mpirun --oversubscribe -np "$NP" "$@"; } 2>&1 )
  local t; t=$(grep -o 'throughput (tokens/s): [0-9.]*' <<<"$out" | awk 'NR>1{s+=$3;n++} END{printf "%.1f", s/n}')
  local c; c=$(grep '^CPU ' <<<"$out" | awk '{printf "%.2f", $2+$3}')
  echo "$t $c"
}
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then a=$(one $A "$@"); b=$(one $B "$@"); else b=$(one $B "$@"); a=$(one $A "$@"); fi
  read at ac <<<"$a"; read bt bc <<<"$b"
  echo "round $r before $at tok/s $ac cpu-s | after $bt tok/s $bc cpu-s | tok/s ratio $(awk -v a="$at" -v b="$bt" 'BEGIN{printf "%.3f", b/a}') cpu ratio $(awk -v a="$ac" -v b="$bc" 'BEGIN{printf "%.3f", b/a}')"
done
