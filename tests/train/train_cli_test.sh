#!/usr/bin/env bash
# train_gpt end to end: the main job's loss falls and its metrics file has the promised keys; a
# TOML config is read and overridden by flags; bad flags, layouts and data files fail with a
# clear message and a non-zero exit, without hanging the job.
#   train_cli_test.sh TRAIN_GPT MPIEXEC CASE
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL ($case_): $*"; exit 1; }
run() { timeout 300 "$mpiexec" --oversubscribe "$@"; }

expect_error() {  # expect_error PATTERN ARGS...: non-zero exit and PATTERN in the output
  local pattern=$1; shift
  local out rc
  out=$(run "$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "expected a failure for: $*"
  [ $rc -ne 124 ] || fail "timed out (a hang) for: $*"
  grep -q -- "$pattern" <<<"$out" || { echo "$out" | tail -5; fail "no '$pattern' in the output of: $*"; }
  echo "ok: '$pattern' for: $*"
}

case $case_ in
main_job)
  run -np 8 "$exe" --tp 2 --pp 2 --dp 2 --train-iters 30 --metrics-jsonl "$tmp/m.jsonl" >"$tmp/out" 2>&1 || { tail -20 "$tmp/out"; fail "train_gpt failed"; }
  grep -q "tp = 2" "$tmp/out" || fail "resolved config not printed"
  grep -q "lm loss:" "$tmp/out" || fail "no iteration log line"
  python3 - "$tmp/m.jsonl" <<'PY' || fail "metrics check"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 30, len(rows)
for k in ("iteration", "loss", "grad_norm", "lr", "tokens_per_s", "consumed_samples", "global_batch_size"):
    assert all(k in r for r in rows), k
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"loss {first:.4f} -> {last:.4f}")
assert last < first - 0.5, (first, last)
assert [r["iteration"] for r in rows] == list(range(1, 31))
PY
  ;;
config)
  cat >"$tmp/c.toml" <<'TOML'
tp = 2
pp = 2
schedule = "interleaved"
vpp = 2
micro-batch-size = 2
num-micro-batches = 4
train-iters = 2
TOML
  run -np 4 "$exe" --config "$tmp/c.toml" --train-iters 3 >"$tmp/out" 2>&1 || { tail -20 "$tmp/out"; fail "train_gpt --config failed"; }
  grep -q 'schedule = "interleaved"' "$tmp/out" || fail "config value not applied"
  grep -q "train_iters = 3" "$tmp/out" || fail "command-line override not applied"
  [ "$(grep -c 'lm loss:' "$tmp/out")" -eq 3 ] || fail "expected 3 iterations"
  echo "ok: config file + override"
  ;;
moe)
  run -np 4 "$exe" --moe-every 2 --experts 4 --topk 2 --capacity-factor 1.25 --ep 2 --moe-chunks 2 --train-iters 3 >"$tmp/out" 2>&1 || { tail -20 "$tmp/out"; fail "MoE run failed"; }
  grep -q "ep = 2" "$tmp/out" || fail "MoE config not printed"
  [ "$(grep -c 'load balancing loss:' "$tmp/out")" -eq 3 ] || fail "no load-balancing loss in the log lines"
  expect_error "ep=3 must divide dp=4" -np 4 "$exe" --moe-every 2 --experts 6 --ep 3
  expect_error "needs MoE layers" -np 4 "$exe" --ep 2
  ;;
errors)
  expect_error "tp x pp x dp = 2 x 2 x 2 = 8 but the world has 4 ranks" -np 4 "$exe" --tp 2 --pp 2 --dp 2
  expect_error "cannot be split evenly" -np 4 "$exe" --pp 4 --num-layers 6
  expect_error "global batch 30 is not divisible" -np 2 "$exe" --global-batch-size 30 --micro-batch-size 4
  expect_error "unknown model preset 'gpt5'" -np 1 "$exe" --model gpt5
  expect_error "2f2b" -np 2 "$exe" --schedule 2f2b
  expect_error "/nonexistent/data.bin" -np 2 "$exe" --data /nonexistent/data.bin
  head -c 2000 /dev/urandom >"$tmp/garbage.bin"
  expect_error "$tmp/garbage.bin" -np 2 "$exe" --data "$tmp/garbage.bin"
  expect_error "tp" -np 1 "$exe" --tp 0
  expect_error "--no-such-flag" -np 1 "$exe" --no-such-flag
  printf 'tp = "two"\n' >"$tmp/bad.toml"
  expect_error "two" -np 1 "$exe" --config "$tmp/bad.toml"
  ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_"
