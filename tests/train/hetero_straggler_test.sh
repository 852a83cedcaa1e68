#!/usr/bin/env bash
# A slow device class is reported as a class, with the advice to re-plan (docs/HETEROGENEOUS.md,
# docs/FAULTS.md "Stragglers"): an MPMD job of two classes (mpirun app contexts with
# TRIAX_DEVICE_CLASS fast / slow) whose slow ranks sleep in every step (TRIAX_FAULT slow:MS).
#   class: np 4, classes fast (ranks 0-1) and slow (ranks 2-3), both slow ranks delayed: each is a
#          straggler and the class line names 'slow' with ranks 2,3 and a ratio > 1.
#   rank:  the same job with only rank 3 delayed: a straggler, and no class line (one rank of a
#          class is a faulty rank, not a slow class).
#   hetero_straggler_test.sh TRAIN_GPT MPIEXEC CASE
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail() { echo "FAIL ($case_): $*"; exit 1; }
args=(--model tiny --num-layers 2 --micro-batch-size 1 --seq-length 32 --train-iters 6 --seed 1 --dp-microbatches fast=1,slow=1)

# run_two FAULT_SLOW FAULT_FAST: ranks 0-1 fast, 2-3 slow; each context its own TRIAX_FAULT.
run_two() {
  timeout 120 "$mpiexec" --oversubscribe -np 2 -x TRIAX_DEVICE_CLASS=fast "$exe" "${args[@]}" \
    : -np 2 -x TRIAX_DEVICE_CLASS=slow -x TRIAX_FAULT="$1" "$exe" "${args[@]}" >"$tmp/out" 2>&1
}

case $case_ in
class)
  run_two "2:1:slow:250,3:1:slow:250"; rc=$?; [ $rc -eq 0 ] || { tail -20 "$tmp/out"; fail "exit $rc"; }
  grep -q "straggler: rank 2 " "$tmp/out" && grep -q "straggler: rank 3 " "$tmp/out" || fail "ranks 2 and 3 not reported"
  line=$(grep "device class 'slow' (ranks 2,3: all of its ranks) is persistently slow" "$tmp/out") ||
    { grep -i "strag\|class" "$tmp/out"; fail "no class verdict"; }
  ratio=$(sed -n "s/.*persistently slow: \([0-9.]*\)x the other.*/\1/p" <<<"$line")
  awk -v r="$ratio" 'BEGIN { exit !(r > 1.5) }' || fail "ratio '$ratio' should be well above 1"
  grep -q "re-plan" <<<"$line" || fail "no re-plan advice"
  echo "ok: $line"
  ;;
rank)
  run_two "3:1:slow:250"; rc=$?; [ $rc -eq 0 ] || { tail -20 "$tmp/out"; fail "exit $rc"; }
  grep -q "straggler: rank 3 " "$tmp/out" || fail "rank 3 not reported"
  if grep -q "persistently slow" "$tmp/out"; then fail "one slow rank was reported as a slow class"; fi
  echo "ok: rank 3 is a straggler, its class is not"
  ;;
*) fail "unknown case" ;;
esac
