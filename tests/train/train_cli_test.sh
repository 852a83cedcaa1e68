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

. "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"  # expect_exit, compare_losses

# expect_refusal CODE SECONDS PATTERN ARGS...: like expect_exit, within SECONDS of wall time, never a
# signal, and no negative number in the message (a wrapped size).
expect_refusal() {
  local code=$1 secs=$2 pattern=$3; shift 3
  local out rc t0 t1 line
  t0=$(date +%s.%N)
  out=$(run "$@" 2>&1); rc=$?
  t1=$(date +%s.%N)
  [ $rc -lt 128 ] || { echo "$out" | tail -8; fail "killed by signal $((rc - 128)) for: $*"; }
  [ $rc -eq "$code" ] || { echo "$out" | tail -8; fail "exit $rc, expected $code for: $*"; }
  line=$(grep -F -- "$pattern" <<<"$out")
  [ "$(grep -c . <<<"$line")" -eq 1 ] || { echo "$out" | tail -8; fail "'$pattern' not printed exactly once for: $*"; }
  ! grep -Eq '(^|[^0-9A-Za-z_^])-[0-9]' <<<"$line" || fail "a negative number in: $line"
  python3 -c "import sys; sys.exit(0 if $t1 - $t0 <= $secs else 1)" ||
    fail "took $(python3 -c "print(round($t1 - $t0, 1))") s, more than $secs s, for: $*"
  echo "ok: exit $code within $secs s, one '$pattern' for: $*"
}

# check_summary OUT REASON ITERS CHECKPOINT: the end-of-run summary, once, consistent with the run:
# tokens = iterations x global batch x seq-length (the resolved configuration above it), tokens/s
# = tokens / the iterations' time, a 0-100 % MFU, and the exit reason and last checkpoint given.
check_summary() {
  python3 - "$@" <<'PY' || fail "run summary check"
import re, sys
out, reason, iters, ckpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
text = open(out).read()
rows = dict(re.findall(r"^ run summary \| ([^:]+): (.*)$", text, re.M))
assert text.count(" run summary | exit reason: ") == 1, "the summary is not printed exactly once"
gb = int(re.search(r"^global-batch-size = (\d+)", text, re.M).group(1))
seq = int(re.search(r"^seq-length = (\d+)", text, re.M).group(1))
assert rows["exit reason"] == reason, rows
assert rows["iterations"].startswith(f"{iters} ("), rows["iterations"]
tokens = int(rows["tokens"])
assert tokens == iters * gb * seq, (tokens, iters, gb, seq)
train_s = float(re.search(r"iterations ([0-9.]+) s\)", rows["wall time"]).group(1))
wall_s = float(re.search(r"\(([0-9.]+) s;", rows["wall time"]).group(1))
assert 0 < train_s <= wall_s + 0.1, rows["wall time"]
tps = float(rows["mean throughput (tokens/s)"])
assert abs(tps - tokens / train_s) <= 0.02 * tps + 1, (tps, tokens, train_s)
mfu = float(re.match(r"([0-9.]+)% \(", rows["MFU"]).group(1))
assert 0 < mfu < 100 and "peak 0.097 TFLOP/s per rank" in rows["MFU"], rows["MFU"]
assert rows["last checkpoint"] == ckpt, rows["last checkpoint"]
print(f"ok: summary: {rows}")
PY
}

case $case_ in
hostile)
  # Sizes whose products overflowed (issue 24 item 6: SIGFPE, "-2147483648 virtual stages",
  # "global batch -2", "dimension -16") are refused at resolution: exit 2, one message.
  m=2147483647
  expect_refusal 2 20 "not divisible by tp 65536 x pp 65536 = 4294967296" -np 4 "$exe" --tp 65536 --pp 65536
  expect_refusal 2 20 "pp x vpp (virtual pipeline stages) = 4 x 1073741824 = 4294967296 is too large" \
    -np 4 "$exe" --pp 4 --vpp 1073741824 --schedule interleaved
  expect_refusal 2 20 "pp x vpp (virtual pipeline stages) = 2 x 1073741824 = 2147483648 is too large" \
    -np 4 "$exe" --pp 2 --vpp 1073741824 --schedule interleaved
  expect_refusal 2 20 "tp x pp x dp = $m x $m x $m = " -np 2 "$exe" --tp $m --pp $m --dp $m
  expect_refusal 2 20 "micro-batch x dp x micro-batches = 4611686018427387904 x 2 x 2" \
    -np 2 "$exe" --micro-batch-size 4611686018427387904 --num-micro-batches 2
  expect_refusal 2 20 "micro-batches per iteration is too many" -np 2 "$exe" --global-batch-size 4611686018427387904 --micro-batch-size 1
  expect_refusal 2 20 "micro-batch x seq-length (tokens per micro-batch) = 4 x $m" \
    -np 2 "$exe" --seq-length $m --max-position-embeddings $m
  expect_refusal 2 20 "the MLP size 4 x --hidden-size = 4 x 1073741824" -np 2 "$exe" --hidden-size 1073741824 --num-attention-heads 1
  expect_refusal 2 20 "--vocab-size $m padded to a multiple of lcm(64, tp 1) = 64 is 2147483648: too large" -np 2 "$exe" --vocab-size $m
  expect_refusal 2 20 "over 2^24" -np 4 "$exe" --pp 4 --vpp 268435456 --schedule interleaved --num-layers 1073741824
  ;;
huge_shapes)
  # Shapes that built for minutes (issue 24 item 7) are refused from the memory model alone,
  # before any allocation: singletons within 5 s, and once under mpirun.
  for flags in "--num-layers 2147483647" "--moe-every 2 --experts 2147483647" "--vocab-size 2000000000" \
               "--hidden-size 1048576 --num-attention-heads 1"; do
    out=$( { /usr/bin/time -f "%e s %M KiB" timeout 60 "$exe" $flags --train-iters 1; } 2>&1); rc=$?
    [ $rc -eq 5 ] || { echo "$out" | tail -5; fail "exit $rc, expected 5 for: $flags"; }
    grep -q "out of memory, refused before allocating: the memory model" <<<"$out" || { echo "$out" | tail -3; fail "no refusal for: $flags"; }
    secs=$(tail -1 <<<"$out" | cut -d' ' -f1); kib=$(tail -1 <<<"$out" | cut -d' ' -f3)
    python3 -c "import sys; sys.exit(0 if $secs <= 5 and $kib < 1048576 else 1)" ||
      fail "$flags: refused after $secs s at $kib KiB (expected within 5 s and 1 GiB)"
    echo "ok: $flags refused in $secs s, $kib KiB"
  done
  expect_refusal 5 30 "out of memory, refused before allocating" -np 4 "$exe" --num-layers 2147483647
  ;;
memory)
  # Issue 24 item 5: a prediction over the available memory is refused before allocating (exit 5)
  # with the prediction, the limit and the flag to change. TRIAX_MEMORY_LIMIT_MIB stands in for a
  # smaller machine; without it the same run trains.
  expect_refusal 5 30 "MiB are available (TRIAX_MEMORY_LIMIT_MIB); the largest, a rank of pipeline stage 0, needs" \
    -np 2 -x TRIAX_MEMORY_LIMIT_MIB=100 "$exe" --num-layers 2 --micro-batch-size 128 --train-iters 1
  out=$(TRIAX_MEMORY_LIMIT_MIB=100 run -np 2 -x TRIAX_MEMORY_LIMIT_MIB "$exe" --num-layers 2 --micro-batch-size 128 --train-iters 1 2>&1)
  grep -q "for the 2 ranks on host .* To fit: lower --micro-batch-size (now 128)" <<<"$out" || { echo "$out" | tail -3; fail "no prediction or flag"; }
  run -np 2 "$exe" --num-layers 2 --micro-batch-size 128 --train-iters 1 >"$tmp/out" 2>&1 || { tail -5 "$tmp/out"; fail "the same run without the limit failed"; }
  echo "ok: the same run trains without the limit"
  # The issue's example: gpt2-124m, micro-batch 4096, ~1.4 TiB of activations on this host.
  expect_refusal 5 60 "lower --micro-batch-size (now 4096)" -np 2 "$exe" --model gpt2-124m --tp 2 --micro-batch-size 4096
  ;;
textfile)
  # Issue 24 item 8: two jobs rewriting one --metrics-textfile both finish (they raced on
  # PATH.tmp: one died with exit 3), and an unwritable textfile is one warning, not the end.
  small=(--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1 --train-iters 400)
  timeout 300 "$exe" "${small[@]}" --metrics-textfile "$tmp/job.prom" >"$tmp/a" 2>&1 & pa=$!
  timeout 300 "$exe" "${small[@]}" --metrics-textfile "$tmp/job.prom" >"$tmp/b" 2>&1 & pb=$!
  wait $pa; ra=$?; wait $pb; rb=$?
  [ $ra -eq 0 ] && [ $rb -eq 0 ] || { tail -3 "$tmp/a" "$tmp/b"; fail "two writers of one textfile: exits $ra and $rb"; }
  grep -q "^triax_iteration 400$" "$tmp/job.prom" || fail "the textfile does not end at iteration 400"
  [ "$(ls "$tmp" | grep -c 'job.prom.tmp')" -eq 0 ] || fail "temporary files left behind"
  echo "ok: two writers of one textfile both finished"
  run -np 2 "$exe" --train-iters 5 --metrics-textfile "$tmp/missing/job.prom" >"$tmp/out" 2>&1 ||
    { tail -5 "$tmp/out"; fail "an unwritable textfile ended the run"; }
  [ "$(grep -c 'lm loss:' "$tmp/out")" -eq 5 ] || fail "expected 5 iterations"
  [ "$(grep -c -- "--metrics-textfile: $tmp/missing/job.prom: cannot create temporary file" "$tmp/out")" -eq 1 ] ||
    { grep -i textfile "$tmp/out"; fail "expected exactly one (rate-limited) warning"; }
  echo "ok: an unwritable textfile is one warning"
  ;;
late)
  # Late or unclear errors of issue 24: a NUL in a config file, an unresolvable --metrics-bind, a
  # Megatron index with overlapping pointers (accepted before without --data-respect-eod).
  printf 'tp = 1\ndata = "ab\000cd"\n' >"$tmp/nul.toml"
  expect_exit 2 "$tmp/nul.toml:2:11: a NUL byte in the value of key 'data'" -np 2 "$exe" --config "$tmp/nul.toml"
  printf 'data = "ab\\u0000cd"\n' >"$tmp/nul2.toml"
  expect_exit 2 "$tmp/nul2.toml:1: data = \"ab\\u0000cd\": a NUL character (\\u0000) at position 2" -np 2 "$exe" --config "$tmp/nul2.toml"
  expect_exit 2 "--metrics-bind 'not a host': the address cannot be resolved" -np 2 "$exe" --metrics-bind 'not a host' --metrics-port 0 --train-iters 1
  python3 - "$tmp/zero" <<'PY'
import struct, sys
pre = sys.argv[1]
lengths = [300, 300, 300]
open(pre + ".bin", "wb").write(struct.pack("<1024H", *[(7 * i) % 256 for i in range(1024)]))  # valid tokens
idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 8, len(lengths), len(lengths) + 1)
idx += struct.pack("<3i", *lengths) + struct.pack("<3q", 0, 0, 0) + struct.pack("<4q", 0, 1, 2, 3)
open(pre + ".idx", "wb").write(idx)
PY
  expect_exit 3 "$tmp/zero.idx: offset 54: sequence 1 starts at byte 0 with 300 tokens of 2 bytes: it overlaps sequence 0" \
    -np 2 "$exe" --data "$tmp/zero" --train-iters 1
  ;;
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
  grep -v -e '^ iteration' -e '^\[triax ' -e '^ run summary | ' "$tmp/a" >"$tmp/a.toml"  # log lines (a straggler warning) and the summary vary
  grep -q '^micro-batch-size = 2$' "$tmp/a.toml" || fail "no micro-batch-size line in the printed configuration"
  # Printed by sections: tp under [parallel], train-iters under [training].
  awk '/^\[/{sec=$0} /^tp = /{print sec}' "$tmp/a.toml" | grep -qx '\[parallel\]' || fail "tp is not under [parallel]"
  awk '/^\[/{sec=$0} /^train-iters = /{print sec}' "$tmp/a.toml" | grep -qx '\[training\]' || fail "train-iters is not under [training]"
  run -np 4 "$exe" --config "$tmp/a.toml" >"$tmp/b" 2>&1 || { tail -20 "$tmp/b"; fail "the printed configuration did not run: $(head -c 600 "$tmp/b")"; }
  grep -v -e '^ iteration' -e '^\[triax ' -e '^ run summary | ' "$tmp/b" >"$tmp/b.toml"
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
  # gpt2-1.5b needs ~25 GB for its fp32 weights, gradients and moments: over a 3 GiB address space,
  # refused before allocating (the address-space limit is one of the limits compared).
  out=$( (ulimit -v 3145728; timeout 300 "$exe" --model gpt2-1.5b --train-iters 1) 2>&1); rc=$?
  [ $rc -eq 5 ] || { echo "$out" | tail -5; fail "out of memory: exit $rc, expected 5"; }
  grep -q "out of memory, refused before allocating" <<<"$out" && grep -q "the address-space limit (ulimit -v)" <<<"$out" &&
    grep -q "parameters [0-9.]* MiB" <<<"$out" && grep -q "the memory model (docs/PLANNER.md)" <<<"$out" ||
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
# the ETA to --train-iters: the remaining iterations at the mean time so far, 0 at the last
assert all(r["eta_s"] >= 0 for r in rows) and rows[-1]["eta_s"] == 0, [r["eta_s"] for r in rows]
mean = sum(r["elapsed_ms"] for r in rows[:10]) / 10 / 1e3
assert abs(rows[9]["eta_s"] - 20 * mean) <= 1e-6 * max(1.0, 20 * mean), (rows[9]["eta_s"], 20 * mean)
PY
  check_summary "$tmp/out" completed 30 "none (no --save)"
  grep -q "^# run: layout 8 ranks = tp 2 x pp 2 x dp 2 (vpp 1, ep 1), schedule 1f1b, ZeRO 0," "$tmp/out" &&
    grep -q "^# run: model tiny: .*params=" "$tmp/out" && grep -q "^# run: data synthetic" "$tmp/out" &&
    grep -q "^# run: metrics to standard output (one line per iteration), --metrics-jsonl $tmp/m.jsonl; checkpoints not saved" "$tmp/out" ||
    { head -5 "$tmp/out"; fail "the first lines do not say what the run is"; }
  [ "$(grep -c ' ETA: [0-9]*:[0-9][0-9]:[0-9][0-9] |$' "$tmp/out")" -eq 30 ] || fail "not every iteration line ends with an ETA"
  grep -q "iteration       30/      30 .* ETA: 0:00:00 |$" "$tmp/out" || fail "the last iteration's ETA is not 0:00:00"
  ;;
summary)
  # The summary of a run that saves, and of its resume: the checkpoint save and load print bytes
  # and MiB/s, the summary names the last checkpoint; iterations and tokens are this run's.
  run -np 2 "$exe" --dp 2 --train-iters 4 --save-interval 2 --save "$tmp/ck" >"$tmp/out" 2>&1 || { tail -20 "$tmp/out"; fail "train_gpt failed"; }
  [ "$(grep -cE "saved checkpoint $tmp/ck/iter_000000[24] \([0-9.]+ MiB in [0-9]+ files\).* \([0-9]+ MiB/s\)" "$tmp/out")" -eq 2 ] ||
    { grep checkpoint "$tmp/out"; fail "no save line with its MiB and MiB/s for each of the two saves"; }
  check_summary "$tmp/out" completed 4 "$tmp/ck/iter_0000004"
  run -np 2 "$exe" --dp 2 --train-iters 7 --save "$tmp/ck" --load "$tmp/ck" >"$tmp/out2" 2>&1 || { tail -20 "$tmp/out2"; fail "the resume failed"; }
  grep -qE "loaded checkpoint $tmp/ck/iter_0000004 \([0-9.]+ MiB in [0-9]+ files\) in [0-9.]+ ms \([0-9]+ MiB/s\)" "$tmp/out2" ||
    { grep checkpoint "$tmp/out2"; fail "no load line with its MiB and MiB/s"; }
  grep -q "^ run summary | iterations: 3 (5 to 7 of --train-iters 7)$" "$tmp/out2" || { grep "run summary" "$tmp/out2"; fail "the resumed run's iterations"; }
  check_summary "$tmp/out2" completed 3 "$tmp/ck/iter_0000007"
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
  conf() { grep -v -e '^ iteration' -e '^\[triax ' -e '^ run summary | ' "$1"; }  # the summary's times vary
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
precision)
  # Mixed precision: cpu and cpu-checked compute in float32 only; --bf16/--fp16 are refused with the
  # flag and the backend named (exit 2, one message per job), from flags and from [training].
  expect_exit 2 "--bf16 needs a backend that computes in bfloat16: --backend cpu computes in float32 only" \
    -np 2 "$exe" --bf16 --train-iters 1
  expect_exit 2 "--fp16 needs a backend that computes in float16: --backend cpu-checked computes in float32 only" \
    -np 2 "$exe" --fp16 --backend cpu-checked --train-iters 1
  expect_exit 2 "--bf16 and --fp16 are mutually exclusive" -np 1 "$exe" --bf16 --fp16 --train-iters 1
  printf '[training]\nbf16 = true\n' >"$tmp/bf16.toml"
  expect_exit 2 "--bf16 needs a backend that computes in bfloat16" -np 1 "$exe" --config "$tmp/bf16.toml"
  # The emulated CPU backend computes in them (tp 2: bf16 activations over the TP collectives).
  for flag in --bf16 --fp16; do
    run -np 2 "$exe" $flag --backend cpu-emulated --tp 2 --num-layers 2 --train-iters 2 >"$tmp/out" 2>&1 ||
      { tail -5 "$tmp/out"; fail "$flag --backend cpu-emulated --tp 2 failed"; }
    echo "ok: $flag --backend cpu-emulated --tp 2 trains"
  done
  ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_"
