#!/usr/bin/env bash
# Memory per rank under ZeRO 0-3 (issue 27): train_gpt's "# memory:" line (the allocator's
# high-water mark of every rank next to the memory model of include/triax/train/memory_plan.h)
# for a model whose parameters dominate (16 layers of width 256, micro-batch 1, seq 16).
#   dp4: np 4 dp 4, --zero 0, 1, 2, 3: every rank's measured peak within 10% of its prediction, and
#        ZeRO-3's peak below ZeRO-1's by the predicted difference (within 10%).
#   dp8: np 8 dp 8 --zero 3: within 10% of the prediction, whose shard is 1/8 of the parameters
#        (padded units) for the masters, gradients and moments, plus the gathered units in flight.
#   cp:  llama-tiny at seq 1024 (activations dominate) on cp 1, 2 and 4 ranks (p2p and allgather,
#        issue 28): within 10% on every rank, the predicted activations 1/cp of cp 1's, and the
#        measured peak falling with cp.
#   zero_memory_test.sh TRAIN_GPT MPIEXEC CASE
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
fail() { echo "FAIL ($case_): $*" >&2; exit 1; }
layers=16
model=(--model tiny --hidden-size 256 --num-layers $layers --micro-batch-size 1 --seq-length 16 --train-iters 2)

# run NP ZERO: the run's output in $out (fails on a non-zero exit or a timeout).
run() {
  local np=$1 zero=$2 rc
  out=$(timeout 120 "$mpiexec" --oversubscribe -np "$np" "$exe" "${model[@]}" --dp "$np" --zero "$zero" 2>&1); rc=$?
  [ $rc -ne 124 ] || fail "np $np --zero $zero timed out"
  [ $rc -eq 0 ] || { echo "$out" | tail -8; fail "np $np --zero $zero exited $rc"; }
}

# check NP ZERO: prints "zero measured_MiB predicted_MiB params shard" of rank 0; fails unless every
# rank's measured / predicted is within 10% and the line is printed once.
check() {
  python3 - "$1" "$2" "$out" <<'PY' || fail "np $1 --zero $2: memory check"
import re, sys
np_, zero, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lines = [l for l in out.splitlines() if "# memory: rank" in l]
if len(lines) != 1:
    sys.exit(f"expected one '# memory:' line, got {len(lines)}:\n" + out[-2000:])
l = lines[0]
m = re.search(r"measured / predicted ([0-9.]+) to ([0-9.]+) over (\d+) ranks", l)
r0 = re.search(r"rank 0: ([0-9.]+) MiB measured, predicted ([0-9.]+) MiB", l)
p = re.search(r"# this rank: (\d+) parameters", out)
if not (m and r0 and p):
    sys.exit("unparsable: " + l)
lo, hi, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
if n != np_ or not (0.9 <= lo and hi <= 1.1):
    sys.exit(f"measured / predicted {lo} to {hi} over {n} ranks: not within 10% on every rank\n{l}")
shard = re.search(r"ZeRO-\d: [a-z, ]+ of (\d+) values, 1/(\d+)", l)
print(zero, r0.group(1), r0.group(2), p.group(1), shard.group(1) if shard else p.group(1))
print("   ", l, file=sys.stderr)
PY
}

case $case_ in
  dp4)
    res=""
    for z in 0 1 2 3; do
      run 4 $z
      res+="$(check 4 $z)"$'\n' || exit 1
    done
    echo "np 4 dp 4: zero, rank 0 measured MiB, predicted MiB, parameters, shard values"
    echo "$res"
    python3 - "$res" <<'PY' || fail "ZeRO-3 against ZeRO-1"
import sys
rows = {int(r.split()[0]): [float(x) for x in r.split()[1:]] for r in sys.argv[1].strip().splitlines()}
meas = rows[1][0] - rows[3][0]
pred = rows[1][1] - rows[3][1]
params = rows[1][2]
print(f"ZeRO-1 - ZeRO-3: {meas:.2f} MiB measured, {pred:.2f} MiB predicted "
      f"(weights and gradients whole: {8 * params / 2**20:.2f} MiB)")
# ZeRO-3 drops the whole weights and gradients (8 bytes a parameter) for the gathered and in-flight units.
if not pred > 0.75 * 8 * params / 2**20:
    sys.exit(f"predicted difference {pred:.2f} MiB is not most of the whole weights and gradients")
if abs(meas - pred) > 0.1 * pred:
    sys.exit(f"measured difference {meas:.2f} MiB is not within 10% of the predicted {pred:.2f} MiB")
PY
    ;;
  dp8)
    run 8 3
    row=$(check 8 3) || exit 1
    echo "np 8 dp 8 --zero 3: rank 0 measured MiB, predicted MiB, parameters, shard values: $row"
    python3 - "$row" "$layers" <<'PY' || fail "ZeRO-3 shard at dp 8"
import sys
zero, meas, pred, params, shard = sys.argv[1].split()
params, shard = int(params), int(shard)
units = int(sys.argv[2]) + 2  # the layers, the embedding and the head: each padded to a multiple of 8
if not 0 <= 8 * shard - params < 8 * units:
    sys.exit(f"shard {shard} is not 1/8 of {params} parameters padded per unit")
state = 16 * shard / 2**20
print(f"1/8 of parameters + gradients + moments: {state:.2f} MiB; the rest of the {float(meas):.2f} MiB measured "
      f"({float(meas) - state:.2f} MiB): gathered and in-flight units, activations, working buffers")
PY
    ;;
  cp)
    rows=""
    for v in "1 p2p" "2 p2p" "2 allgather" "4 p2p" "4 allgather"; do
      set -- $v
      out=$(timeout 300 "$mpiexec" --oversubscribe -np "$1" "$exe" --model llama-tiny --seq-length 1024 \
        --micro-batch-size 2 --global-batch-size 2 --train-iters 2 --cp "$1" --cp-comm-type "$2" 2>&1) ||
        { echo "$out" | tail -8; fail "cp $1 $2 exited"; }
      row=$(check "$1" 0) || exit 1
      act=$(echo "$out" | sed -n -E 's/.*# memory: .* \+ activations ([0-9.]+) MiB.*/\1/p')
      [ -n "$act" ] || fail "cp $1 $2: no activations term"
      rows+="$1 $2 $row $act"$'\n'
    done
    echo "cp, comm type, zero, rank 0 measured MiB, predicted MiB, parameters, shard, predicted activations MiB"
    echo "$rows"
    python3 - "$rows" <<'PY' || fail "activations under cp"
import sys
rows = [r.split() for r in sys.argv[1].strip().splitlines()]
act1, meas1 = float(rows[0][7]), float(rows[0][3])
for r in rows[1:]:
    cp, act, meas = int(r[0]), float(r[7]), float(r[3])
    if abs(act * cp - act1) > 0.01 * act1 + 0.1 * cp:
        sys.exit(f"cp {cp} {r[1]}: predicted activations {act} MiB are not 1/{cp} of cp 1's {act1} MiB")
    if not meas < meas1 * (0.5 + 0.5 / cp) + 1:
        sys.exit(f"cp {cp} {r[1]}: measured peak {meas} MiB does not fall from cp 1's {meas1} MiB")
PY
    ;;
  *) fail "unknown case" ;;
esac
echo "ok ($case_)"
