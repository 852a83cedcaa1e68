#!/usr/bin/env bash
# train.timeline.*: --profile-steps / --profile-dir (docs/OBSERVE.md, "Timeline").
#   pp4_1f1b: a 1F1B run at pp 4 (4 ranks, m = 8) records iterations 2..4; the merged trace parses,
#             has every rank's track and lanes, and each step's bubble measured from the trace
#             matches the schedule simulator's (tests/train/timeline_check.py says how closely).
#             Every compute is padded by TRIAX_PIPELINE_PAD_US (a sleep): the ranks share 2 cores
#             here, and sleeping "compute" runs on all stages at once, as on a real machine.
#   errors:   a malformed window and a window without a directory are refused (exit 2).
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL ($case_): $*"; exit 1; }
run() { timeout 300 "$mpiexec" --oversubscribe "$@"; }
# Messages of 16 x 32 floats (2 KiB) stay under the shared-memory eager limit: a larger one waits
# for its sender's next MPI call (rendezvous without single-copy), an idle the simulator lacks.
tiny=(--num-layers 4 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1)

case "$case_" in
  pp4_1f1b)
    TRIAX_PIPELINE_PAD_US=40000 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 \
      run -np 4 -x TRIAX_PIPELINE_PAD_US -x OMPI_MCA_mpi_yield_when_idle -x OMP_NUM_THREADS \
      "$exe" --pp 4 --schedule 1f1b "${tiny[@]}" --num-micro-batches 8 --train-iters 5 \
      --profile-steps 2:4 --profile-dir "$tmp/trace" >"$tmp/out" 2>&1 || { tail -20 "$tmp/out"; fail "train_gpt failed"; }
    grep -q "timeline of iterations 2..4 (4 ranks) written to $tmp/trace/trace.json" "$tmp/out" \
      || { tail -5 "$tmp/out"; fail "rank 0 did not say where the timeline is"; }
    for r in 0 1 2 3; do [ -s "$tmp/trace/trace_rank$r.json" ] || fail "no trace_rank$r.json"; done
    python3 "$here/timeline_check.py" "$tmp/trace/trace.json" --ranks 4 --pp 4 --micro-batches 8 --steps 2,3,4 \
      || fail "timeline check failed"
    ;;
  errors)
    for bad in "4:2" "0:3" "3" "a:b" "2:3x"; do
      out=$(run -np 1 "$exe" "${tiny[@]}" --train-iters 1 --profile-steps "$bad" --profile-dir "$tmp/x" 2>&1); rc=$?
      [ $rc -eq 2 ] || { echo "$out" | tail -3; fail "--profile-steps $bad: exit $rc, expected 2"; }
      grep -qF -- "--profile-steps '$bad': expected A:B" <<<"$out" || { echo "$out" | tail -3; fail "no message for $bad"; }
    done
    out=$(run -np 1 "$exe" "${tiny[@]}" --train-iters 1 --profile-steps 1:1 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -qF -- "--profile-steps 1:1 needs --profile-dir" <<<"$out" || { echo "$out" | tail -3; fail "no --profile-dir refusal"; }
    echo "ok: malformed windows and a missing --profile-dir are refused"
    ;;
  *) fail "unknown case" ;;
esac
echo "PASS ($case_)"
