#!/usr/bin/env bash
# train_gpt end to end: the main job's loss falls and its metrics file has the promised keys; a
# sectioned TOML config is read, equals the same flags, and is overridden by flags; bad flags, layouts and data files fail with a
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

# expect_exit CODE PATTERN ARGS...: exit status CODE, PATTERN on exactly one line of the output
# (one message per job, whatever the rank count), and no Open MPI error-log noise.
expect_exit() {
  local code=$1 pattern=$2; shift 2
  local out rc n
  out=$(run "$@" 2>&1); rc=$?
  [ $rc -ne 124 ] || fail "timed out (a hang) for: $*"
  [ $rc -eq "$code" ] || { echo "$out" | tail -8; fail "exit $rc, expected $code for: $*"; }
  n=$(grep -cF -- "$pattern" <<<"$out")
  [ "$n" -eq 1 ] || { echo "$out" | tail -8; fail "'$pattern' printed $n times (expected once) for: $*"; }
  ! grep -q "ORTE_ERROR_LOG" <<<"$out" || { grep -n "ORTE_ERROR_LOG" <<<"$out"; fail "ORTE_ERROR_LOG noise for: $*"; }
  echo "ok: exit $code, one '$pattern' for: $*"
}

case $case_ in
config_file)
  # Unknown keys, typos, sections, malformed files and wrong types name the file, line and key.
  printf 'tp = 1\ntrain_iters = 3\n' >"$tmp/u.toml"
  expect_exit 2 "$tmp/u.toml:2: unknown key 'train_iters' (did you mean 'train-iters'?)" -np 2 "$exe" --config "$tmp/u.toml"
  printf 'train-itrs = 3\n' >"$tmp/t.toml"
  expect_exit 2 "$tmp/t.toml:1: unknown key 'train-itrs' (did you mean 'train-iters'?)" -np 2 "$exe" --config "$tmp/t.toml"
  printf '[section]\ntrain-iters = 3\n' >"$tmp/s.toml"
  expect_exit 2 "$tmp/s.toml:1: unknown section [section]; the sections are [model], [parallel]" -np 2 "$exe" --config "$tmp/s.toml"
  printf '[model]\nnum-layers = 4\ntp = 2\n' >"$tmp/ws.toml"
  expect_exit 2 "$tmp/ws.toml:3: 'tp' belongs in [parallel], not [model]" -np 2 "$exe" --config "$tmp/ws.toml"
  printf '[training]\ntrain-iters = 0\n' >"$tmp/rs.toml"
  expect_exit 2 "$tmp/rs.toml:2: train-iters = 0: out of range; expected an integer >= 1" -np 2 "$exe" --config "$tmp/rs.toml"
  printf 'tp = 1\n[[[bad\n' >"$tmp/m1.toml"
  expect_exit 2 "$tmp/m1.toml:2:" -np 2 "$exe" --config "$tmp/m1.toml"
  printf '= =\n' >"$tmp/m2.toml"
  expect_exit 2 "$tmp/m2.toml:1:" -np 2 "$exe" --config "$tmp/m2.toml"
  printf 'train-iters = "three"\n' >"$tmp/w.toml"
  expect_exit 2 "$tmp/w.toml:1: train-iters = \"three\": a string is the wrong type; expected an integer >= 1" -np 2 "$exe" --config "$tmp/w.toml"
  printf 'clip-grad = -1.0\n' >"$tmp/r.toml"
  expect_exit 2 "$tmp/r.toml:1: clip-grad = -1.0: out of range" -np 2 "$exe" --config "$tmp/r.toml"
  expect_exit 3 "--config $tmp/none.toml: cannot open" -np 2 "$exe" --config "$tmp/none.toml"
  expect_exit 2 "unknown flag --train-itrs (did you mean '--train-iters'?)" -np 2 "$exe" --train-itrs 3
  ;;
roundtrip)
  # The printed configuration is a --config file that repeats the run exactly.
  run -np 4 "$exe" --tp 2 --pp 2 --schedule zb-h1 --micro-batch-size 2 --num-layers 4 --seq-length 32 --lr 0.002 \
    --clip-grad 0.5 --recompute selective --train-iters 3 --lr-decay-style linear >"$tmp/a" 2>&1 || { tail -20 "$tmp/a"; fail "first run failed"; }
  grep -v -e '^ iteration' -e '^\[triax ' "$tmp/a" >"$tmp/a.toml"  # log lines (a straggler warning) vary
  grep -q '^micro-batch-size = 2$' "$tmp/a.toml" || fail "no micro-batch-size line in the printed configuration"
  # Printed by sections: tp under [parallel], train-iters under [training].
  awk '/^\[/{sec=$0} /^tp = /{print sec}' "$tmp/a.toml" | grep -qx '\[parallel\]' || fail "tp is not under [parallel]"
  awk '/^\[/{sec=$0} /^train-iters = /{print sec}' "$tmp/a.toml" | grep -qx '\[training\]' || fail "train-iters is not under [training]"
  run -np 4 "$exe" --config "$tmp/a.toml" >"$tmp/b" 2>&1 || { tail -20 "$tmp/b"; fail "the printed configuration did not run: $(head -c 600 "$tmp/b")"; }
  grep -v -e '^ iteration' -e '^\[triax ' "$tmp/b" >"$tmp/b.toml"
  diff "$tmp/a.toml" "$tmp/b.toml" || fail "the configuration read back differs from the one printed"
  losses() { grep -o 'lm loss: [^|]*| grad norm: [^|]*' "$1"; }
  [ "$(losses "$tmp/a" | wc -l)" -eq 3 ] || fail "expected 3 iterations"
  diff <(losses "$tmp/a") <(losses "$tmp/b") || fail "the run from the printed configuration trained differently"
  echo "ok: printed configuration -> --config -> the same configuration and losses"
  ;;
ranges)
  # Zero is not "default": every out-of-range value is refused with its valid range, once.
  for f in --micro-batch-size --global-batch-size --num-layers --seq-length --num-micro-batches --dp --train-iters \
           --num-attention-heads --hidden-size --tp --pp --vpp --experts --moe-chunks; do
    expect_exit 2 "$f 0: out of range; expected an integer" -np 2 "$exe" $f 0
  done
  expect_exit 2 "--vocab-size 0: out of range; expected an integer >= 2" -np 2 "$exe" --vocab-size 0
  expect_exit 2 "--bucket-mb -3: out of range; expected a number in (0, 1048576]" -np 2 "$exe" --bucket-mb -3
  expect_exit 2 "--clip-grad -1: out of range; expected a number in [0, " -np 2 "$exe" --clip-grad -1
  expect_exit 2 "--lr nan: out of range" -np 2 "$exe" --lr nan
  expect_exit 2 "--adam-beta1 1: out of range; expected a number in [0, 1)" -np 2 "$exe" --adam-beta1 1
  expect_exit 2 "--topk 3: out of range; expected an integer in [1, 2]" -np 2 "$exe" --topk 3
  expect_exit 2 "--tp 'two': not an integer" -np 2 "$exe" --tp two
  expect_exit 2 "--pipeline-layers '3,': an empty entry" -np 2 "$exe" --pp 2 --pipeline-layers 3,
  expect_exit 2 "--schedule \"2f2b\": not a known value; expected one of gpipe, 1f1b, interleaved, zb-h1" -np 2 "$exe" --schedule 2f2b
  expect_exit 2 "--seq-length needs 1 value" -np 2 "$exe" --seq-length
  ;;
one_message)
  # Errors every rank detects alike: one copy at np 4, the documented exit code, no abort noise.
  expect_exit 2 "cannot be split evenly" -np 4 "$exe" --pp 4 --num-layers 6
  expect_exit 2 "tp x pp x dp = 2 x 2 x 2 = 8 but the world has 4 ranks" -np 4 "$exe" --tp 2 --pp 2 --dp 2
  expect_exit 3 "/nonexistent/data.bin" -np 4 "$exe" --data /nonexistent/data.bin
  expect_exit 2 "--model \"gpt5\": not a known value; expected one of" -np 4 "$exe" --model gpt5
  # Rank 0 slow to start (MPMD: rank 0 sleeps first): the other ranks' exit must not make mpirun
  # kill rank 0 before it has printed the message.
  expect_exit 2 "--model \"gpt5\": not a known value; expected one of" \
    -np 1 sh -c "sleep 2; exec \"$exe\" --model gpt5" : -np 3 "$exe" --model gpt5
  ;;
writes)
  # Every write is checked: a full disk is an error with the file's name and exit 3.
  [ -w /dev/full ] || { echo "SKIP: no /dev/full"; exit 77; }
  expect_exit 3 "--metrics-jsonl /dev/full: write failed: No space left on device" -np 2 "$exe" --train-iters 2 --metrics-jsonl /dev/full
  # Without mpirun (a singleton): under mpirun the launcher, not train_gpt, writes the terminal.
  out=$(timeout 300 "$exe" --train-iters 2 2>&1 >/dev/full); rc=$?
  [ $rc -eq 3 ] || fail "stdout on a full disk: exit $rc, expected 3"
  grep -q "standard output: write failed" <<<"$out" || fail "no write error for stdout: $out"
  echo "ok: stdout on a full disk"
  ;;
inputs)
  # Data specs a user gets wrong, the end of an epoch, and out of memory at start-up.
  mkdir -p "$tmp/somedir"
  expect_exit 3 "$tmp/somedir/: is a directory" -np 2 "$exe" --data "$tmp/somedir/"
  head -c 4000 /dev/urandom >"$tmp/good.bin"
  expect_exit 2 "'$tmp/good.bin,': an empty entry in the comma list" -np 2 "$exe" --data "$tmp/good.bin,"
  printf 'hello\n' >"$tmp/notes.txt"   # a text file in a list of token shards
  expect_exit 3 "$tmp/notes.txt: file is 6 bytes, shorter than the 1024-byte token shard header" -np 2 "$exe" --data "$tmp/notes.txt,$tmp/good.bin"
  head -c 300 /dev/urandom >"$tmp/short.txt"   # 299 / 16 = 18 samples; 8 per iteration
  run -np 2 "$exe" --data "$tmp/short.txt" --seq-length 16 --global-batch-size 8 --micro-batch-size 2 --train-iters 5 \
    >"$tmp/out" 2>&1 || { tail -5 "$tmp/out"; fail "short text run failed"; }
  [ "$(grep -c "epoch [0-9]* of text file $tmp/short.txt (bytes, 300 tokens).* ended" "$tmp/out")" -eq 2 ] ||
    { grep epoch "$tmp/out"; fail "expected two epoch ends (at 24 and 40 samples of 18 per epoch)"; }
  grep -q "epoch 1 of .* ended at iteration 3 (18 samples of 17 tokens per epoch)" "$tmp/out" || { grep epoch "$tmp/out"; fail "epoch 1 end"; }
  echo "ok: epoch ends announced"
  # gpt2-1.5b needs ~25 GB for its fp32 weights, gradients and moments: over a 3 GiB address space.
  out=$( (ulimit -v 3145728; timeout 300 "$exe" --model gpt2-1.5b --train-iters 1) 2>&1); rc=$?
  [ $rc -eq 5 ] || { echo "$out" | tail -5; fail "out of memory: exit $rc, expected 5"; }
  grep -q "out of memory while allocating the model, optimizer and pipeline buffers of layers=48" <<<"$out" &&
    grep -q "parameters [0-9]* MiB" <<<"$out" && grep -q "(memory model" <<<"$out" ||
    { echo "$out"; fail "out-of-memory message lacks what, how much, or the prediction"; }
  echo "ok: out of memory at start-up"
  ;;
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
  # A sectioned file (docs/TRAINING.md), overridden by a flag; then the same values as flags, and
  # as a flat file of the same lines (files written before sections): the same run.
  cat >"$tmp/c.toml" <<'TOML'
[parallel]
tp = 2
pp = 2
schedule = "interleaved"
vpp = 2

[training]
micro-batch-size = 2
num-micro-batches = 4
train-iters = 2

[optimizer]
lr = 0.002
TOML
  run -np 4 "$exe" --config "$tmp/c.toml" --train-iters 3 >"$tmp/out" 2>&1 || { tail -20 "$tmp/out"; fail "train_gpt --config failed"; }
  grep -q 'schedule = "interleaved"' "$tmp/out" || fail "config value not applied"
  grep -q "^train-iters = 3$" "$tmp/out" || fail "command-line override not applied"
  [ "$(grep -c 'lm loss:' "$tmp/out")" -eq 3 ] || fail "expected 3 iterations"
  echo "ok: config file + override"
  run -np 4 "$exe" --tp 2 --pp 2 --schedule interleaved --vpp 2 --micro-batch-size 2 --num-micro-batches 4 \
    --train-iters 3 --lr 0.002 >"$tmp/flags" 2>&1 || { tail -20 "$tmp/flags"; fail "the same run from flags failed"; }
  grep -v '^\[' "$tmp/c.toml" | grep -v '^$' >"$tmp/flat.toml"
  run -np 4 "$exe" --config "$tmp/flat.toml" --train-iters 3 >"$tmp/flat" 2>&1 || { tail -20 "$tmp/flat"; fail "the flat file failed"; }
  conf() { grep -v -e '^ iteration' -e '^\[triax ' "$1"; }
  losses() { grep -o 'lm loss: [^|]*| grad norm: [^|]*' "$1"; }
  diff <(conf "$tmp/out") <(conf "$tmp/flags") || fail "the sectioned file and the same flags resolve differently"
  diff <(losses "$tmp/out") <(losses "$tmp/flags") || fail "the sectioned file and the same flags trained differently"
  diff <(conf "$tmp/out") <(conf "$tmp/flat") || fail "the flat file and the sectioned one resolve differently"
  echo "ok: sectioned file = the same flags = the same flat file"
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
  expect_error '"gpt5": not a known value; expected one of' -np 1 "$exe" --model gpt5
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
