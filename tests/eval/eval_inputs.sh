#!/usr/bin/env bash
# gpt_eval on inputs a user gets wrong: weights full of NaN evaluate with one warning that says
# so; --batch 0 is refused once (np 2) with its valid range and exit code 2 (docs/ERRORS.md).
#   eval_inputs.sh GPT_EVAL MPIEXEC DATA_DIR
set -uo pipefail
exe=$1; mpiexec=$2; dir=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 120 "$mpiexec" --oversubscribe "$@"; }

# llm.c checkpoint: a 256 x int32 header, then float32 parameters; every parameter becomes NaN.
python3 - "$dir/model.bin" "$tmp/nan.bin" <<'PY' || fail "cannot write the NaN checkpoint"
import struct, sys
raw = open(sys.argv[1], "rb").read()
n = (len(raw) - 1024) // 4
open(sys.argv[2], "wb").write(raw[:1024] + struct.pack("<f", float("nan")) * n)
PY
out=$(run -np 2 "$exe" --tp 2 --weights "$tmp/nan.bin" --data "$dir/tokens.bin" --batch 2 --seq 16 --batches 1 2>&1); rc=$?
[ $rc -eq 0 ] || { echo "$out" | tail -5; fail "exit $rc on NaN weights"; }
[ "$(grep -c "parameter values are NaN or infinite" <<<"$out")" -eq 1 ] || { echo "$out"; fail "no single NaN-weights warning"; }
grep -q "warning: the mean loss is NaN" <<<"$out" || { echo "$out"; fail "no warning about the NaN loss"; }
echo "ok: NaN weights warn once"

out=$(run -np 2 "$exe" --weights "$dir/model.bin" --data "$dir/tokens.bin" --batch 0 --seq 16 2>&1); rc=$?
[ $rc -eq 2 ] || { echo "$out"; fail "--batch 0: exit $rc, expected 2"; }
[ "$(grep -c -- "--batch: 0 is out of range; expected an integer >= 1" <<<"$out")" -eq 1 ] || { echo "$out"; fail "--batch 0: no single range message"; }
! grep -q "1797693134862" <<<"$out" || fail "--batch 0: CLI11's double range is still printed"
echo "ok: --batch 0"
echo PASS
