#!/usr/bin/env bash
# Context parallelism through train_gpt (issue 28):
#   errors:     each bad --cp input is one clear ConfigError (exit 2, printed once per job, no hang):
#               a sequence not divisible by 2 cp, tp x cp x pp x dp != world, cp not dividing the
#               world, an unknown --cp-comm-type, an order naming cp twice, --cp 0, and a tp x cp
#               block spanning hosts (host names faked per rank with TRIAX_HOSTNAME).
#   done_means: the issue's layout, `-np 8 --model llama-tiny --tp 2 --cp 2 --dp 2`, at seq 128 (past
#               llama-tiny's 64: RoPE extends) trains the one-process losses and gradient norms to
#               1e-5 relative (--metrics-jsonl, full precision), once per --cp-comm-type.
#   resume:     checkpoints do not depend on cp: saved under cp 2 x dp 2 (and at cp 1), resumed at
#               cp 1, cp 4, tp 2 x cp 2 and cp 2 allgather, iteration 3 equals the uninterrupted run.
#   cp_cli_test.sh TRAIN_GPT MPIEXEC CASE
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1  # flight-recorder dumps of the failing runs land here
fail() { echo "FAIL ($case_): $*"; exit 1; }
run() { timeout 120 "$mpiexec" --oversubscribe "$@"; }

. "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"  # expect_exit, compare_losses

# Same seed, data and global batch everywhere; $@ adds the layout.
train() { run "$@" --model llama-tiny --seq-length 128 --global-batch-size 4 --micro-batch-size 1 --train-iters 3 --seed 1; }

case $case_ in
errors)
  expect_exit 2 "--seq-length 60 is not divisible by 2 x cp = 8" -np 4 "$exe" --cp 4 --seq-length 60 --train-iters 1
  expect_exit 2 "tp x cp x pp x dp = 2 x 2 x 1 x 2 = 8 but the world has 4 ranks" \
    -np 4 "$exe" --tp 2 --cp 2 --dp 2 --train-iters 1
  expect_exit 2 "the world of 3 ranks is not divisible by tp 1 x cp 2 x pp 1 = 2" -np 3 "$exe" --cp 2 --train-iters 1
  expect_exit 2 '--cp-comm-type "a2a": not a known value; expected one of p2p, allgather' \
    -np 2 "$exe" --cp 2 --cp-comm-type a2a --train-iters 1
  expect_exit 2 '--order "cp-tp-cp-dp": not a known value' -np 2 "$exe" --cp 2 --order cp-tp-cp-dp --train-iters 1
  expect_exit 2 "--cp 0: out of range; expected an integer >= 1" -np 1 "$exe" --cp 0 --train-iters 1
  # Two hosts of 4 ranks; dp-tp-pp puts dp fastest: the TP pairs (0,2) ... fit a host, the tp x cp
  # block {0,2,4,6} does not, although each host could hold one.
  expect_exit 2 "the tp x cp block of world ranks [0,2,4,6] (tp=2 cp=2) spans 2 hosts" \
    -np 8 bash -c 'TRIAX_HOSTNAME=node$((OMPI_COMM_WORLD_RANK / 4)) exec "$0" "$@"' "$exe" \
    --tp 2 --cp 2 --dp 2 --order dp-tp-pp --train-iters 1
  ;;
done_means)
  train -np 1 "$exe" --metrics-jsonl "$tmp/one.jsonl" >"$tmp/one.out" 2>&1 || { tail -5 "$tmp/one.out"; fail "one process"; }
  for comm in p2p allgather; do
    train -np 8 "$exe" --tp 2 --cp 2 --dp 2 --cp-comm-type $comm --metrics-jsonl "$tmp/$comm.jsonl" >"$tmp/$comm.out" 2>&1 ||
      { tail -5 "$tmp/$comm.out"; fail "tp 2 cp 2 dp 2 ($comm)"; }
    grep -q "^# run: layout 8 ranks = tp 2 x cp 2 ($comm) x pp 1 x dp 2 " "$tmp/$comm.out" ||
      { grep "^# run: layout" "$tmp/$comm.out"; fail "the layout line does not show cp"; }
    grep -q "^cp-comm-type = \"$comm\"" "$tmp/$comm.out" || fail "the resolved configuration lacks cp-comm-type $comm"
    compare_losses "$tmp/one.jsonl" "$tmp/$comm.jsonl"
  done
  ;;
resume)
  # Saved at iteration 2 of 3 under cp 2 x dp 2 (ZeRO-1), resumed at cp 1, cp 4 and tp 2 x cp 2:
  # iteration 3 equals the uninterrupted one-process run. And a cp 1 checkpoint resumes at cp 2.
  small="--model tiny --num-layers 4 --seq-length 64 --global-batch-size 8 --micro-batch-size 1 --train-iters 3 --seed 3"
  run -np 1 "$exe" $small --metrics-jsonl "$tmp/whole.jsonl" >"$tmp/whole.out" 2>&1 || { tail -5 "$tmp/whole.out"; fail "uninterrupted"; }
  for saved in "4:--cp 2 --dp 2 --zero 1" "1:"; do
    rm -rf "$tmp/ck"
    run -np "${saved%%:*}" "$exe" $small ${saved#*:} --save "$tmp/ck" --save-interval 2 >"$tmp/save.out" 2>&1 ||
      { tail -5 "$tmp/save.out"; fail "save at -np $saved"; }
    rm -rf "$tmp/ck/iter_0000003"
    [ -d "$tmp/ck/iter_0000002" ] || fail "no iteration-2 checkpoint from -np $saved"
    for resumed in "1:" "4:--cp 4" "4:--tp 2 --cp 2" "2:--cp 2 --cp-comm-type allgather"; do
      rm -f "$tmp/resumed.jsonl"
      run -np "${resumed%%:*}" "$exe" $small ${resumed#*:} --load "$tmp/ck" --metrics-jsonl "$tmp/resumed.jsonl" \
        >"$tmp/load.out" 2>&1 || { tail -5 "$tmp/load.out"; fail "resume at -np $resumed from -np $saved"; }
      python3 - "$tmp/whole.jsonl" "$tmp/resumed.jsonl" <<'PY' || fail "resumed at -np $resumed from -np $saved: another loss"
import json, sys
whole, resumed = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [r["iteration"] for r in resumed] == [3], resumed
a, b = whole[2]["loss"], resumed[0]["loss"]
assert abs(a - b) <= 1e-5 * abs(a), (a, b)
PY
      echo "ok: saved at -np $saved, resumed at -np $resumed: iteration 3 equals the uninterrupted run"
    done
  done
  ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_"
