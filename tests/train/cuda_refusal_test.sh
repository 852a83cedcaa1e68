#!/usr/bin/env bash
# train_gpt --backend cuda on a machine where CUDA sees no device (or a triax built without CUDA):
# exit 2 within seconds, with one message that names CUDA and the device count it saw.
#   cuda_refusal_test.sh TRAIN_GPT
set -uo pipefail
exe=$(realpath "$1")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; echo "--- output:"; echo "$out" | tail -8; exit 1; }
t0=$(date +%s.%N)
out=$(timeout 60 "$exe" --backend cuda --model nano --train-iters 1 2>&1); rc=$?
elapsed=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$t0" "$(date +%s.%N)")
if [ $rc -eq 0 ]; then
  echo "skip: CUDA sees a device here, so --backend cuda trains; the refusal needs a machine without one"
  exit 77
fi
[ $rc -eq 2 ] || fail "exit $rc after $elapsed s, expected 2 (configuration error)"
grep -q "train_gpt: configuration error: --backend cuda: CUDA sees 0 devices on host " <<<"$out" ||
  fail "the message does not name CUDA and the device count"
n=$(grep -c "configuration error" <<<"$out")
[ "$n" -eq 1 ] || fail "$n error messages, expected one"
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < 10 else 1)' "$elapsed" || fail "took $elapsed s (bound: 10 s)"
echo "ok: exit 2 after $elapsed s: $(grep 'configuration error' <<<"$out")"
