#!/usr/bin/env bash
# Checkpoints end to end under mpirun (docs/CHECKPOINTS.md): exact resume bit for bit, resharded
# resume onto other layouts, a kill -9 during a save, SIGTERM mid-run, --init-from / --export-hf,
# and bad checkpoints refused with a fallback to the previous one.
#   checkpoint_test.sh TRAIN_GPT MPIEXEC CASE [GPT_EVAL]
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3; gpt_eval=${4:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL ($case_): $*"; exit 1; }
run() { timeout 300 "$mpiexec" --oversubscribe "$@"; }
# A small model that every layout below can hold: 4 layers, 4 heads, 8 micro-batches of 4.
base=(--model nano --num-layers 4 --micro-batch-size 4 --global-batch-size 32 --train-iters 8 --lr-decay-iters 8)

# losses FILE: the "loss" of every line of a metrics file, full precision, one per line.
losses() { python3 -c 'import json,sys; [print(repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1"; }
# same_losses A B TOL: the loss lists agree within TOL (0: bit for bit).
same_losses() {
  python3 - "$1" "$2" "$3" <<'PY' || fail "losses differ: $1 vs $2"
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
d = max(abs(x - y) for x, y in zip(a, b))
print(f"max loss difference {d:.3g} over {len(a)} iterations (tolerance {tol})")
assert (a == b) if tol == 0 else d <= tol
PY
}
# Every file of two checkpoints has the same SHA-256: the whole state is identical bit for bit.
same_state() {
  python3 - "$1" "$2" <<'PY' || fail "checkpoint states differ: $1 vs $2"
import json, sys
x, y = (json.load(open(p + "/manifest.json")) for p in sys.argv[1:3])
hx = {f["name"]: f["sha256"] for f in x["files"]}
hy = {f["name"]: f["sha256"] for f in y["files"]}
assert hx and hx == hy, "different file hashes"
print(f"{len(hx)} shard files identical (SHA-256)")
PY
}
ok() { echo "ok: $*"; }

case $case_ in
exact)
  # 8 iterations straight vs 4 + save + resume + 4, at tp2 x pp2 x dp2, with ZeRO-1 and with
  # overlapped DP all-reduce: the same losses and the same saved state, bit for bit.
  for variant in zero1 overlap; do
    extra=(--tp 2 --pp 2); [ $variant = zero1 ] && extra+=(--zero1)
    run -np 8 "$exe" "${base[@]}" "${extra[@]}" --save "straight_$variant" --metrics-jsonl a.jsonl >a.log 2>&1 ||
      { tail -5 a.log; fail "straight run ($variant)"; }
    run -np 8 "$exe" "${base[@]}" "${extra[@]}" --train-iters 4 --save "ck_$variant" --metrics-jsonl b.jsonl >b.log 2>&1 ||
      { tail -5 b.log; fail "first half ($variant)"; }
    [ -f "ck_$variant/iter_0000004/manifest.json" ] || fail "no checkpoint after the first half ($variant)"
    run -np 8 "$exe" "${base[@]}" "${extra[@]}" --load "ck_$variant" --save "ck_$variant" --metrics-jsonl c.jsonl >c.log 2>&1 ||
      { tail -5 c.log; fail "resumed run ($variant)"; }
    grep -q "resumed from ck_$variant/iter_0000004: iteration 4" c.log || { tail -5 c.log; fail "no resume message"; }
    cat b.jsonl c.jsonl >bc.jsonl
    same_losses a.jsonl bc.jsonl 0
    same_state "straight_$variant/iter_0000008" "ck_$variant/iter_0000008"
    ok "exact resume with $variant"
  done
  ;;
reshard)
  # Saved at tp2 x pp2 x dp2 with ZeRO-1, resumed at other layouts: the straight run's losses.
  run -np 8 "$exe" "${base[@]}" --tp 2 --pp 2 --zero1 --metrics-jsonl a.jsonl >a.log 2>&1 || fail "straight run"
  tail -n 4 a.jsonl >a_tail.jsonl
  run -np 8 "$exe" "${base[@]}" --tp 2 --pp 2 --zero1 --train-iters 4 --save ck >b.log 2>&1 || fail "first half"
  for layout in "8 --tp 1 --pp 4" "8 --tp 4 --pp 1" "8 --tp 1 --pp 1" "2 --tp 2 --pp 1" \
                "4 --tp 1 --pp 2 --vpp 2 --schedule interleaved --zero1" "4 --tp 2 --pp 2 --pipeline-layers 1,3"; do
    set -- $layout; np=$1; shift
    rm -f r.jsonl
    run -np "$np" "$exe" "${base[@]}" "$@" --load ck --metrics-jsonl r.jsonl >r.log 2>&1 || { tail -5 r.log; fail "resume at $layout"; }
    grep -q "resumed from ck/iter_0000004" r.log || fail "no resume at $layout"
    same_losses a_tail.jsonl r.jsonl 1e-5
    ok "resharded resume at np $layout"
  done
  ;;
*) fail "unknown case $case_" ;;
esac
