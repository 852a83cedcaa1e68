#!/usr/bin/env bash
# Issue 29's "done means" end to end: a heterogeneous cluster file, the planner's plan for it, and
# train_gpt running that plan (docs/HETEROGENEOUS.md, docs/PLANNER.md "Heterogeneous clusters").
#   done_means: clusters/cpu-two-speeds.toml's classes, two ranks each (fast, and slow at half the
#     GEMM rate); `triax-plan --pp 2 --dp 2 --emit-config run.toml` for the tiny model must give a
#     plan with uneven stages AND uneven DP shares; train_gpt runs run.toml under the launch line the
#     file names (mpirun app contexts, one class each), and its losses and gradient norms equal one
#     process's over the same global batch (1e-5 relative, --metrics-jsonl).
#   hetero_plan_test.sh TRAIN_GPT MPIEXEC CASE TRIAX_PLAN SOURCE_DIR
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3; plan=$4; src=$5
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
fail() { echo "FAIL ($case_): $*"; exit 1; }
run() { timeout 180 "$mpiexec" --oversubscribe "$@"; }
. "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"  # compare_losses

[ "$case_" = done_means ] || fail "unknown case"
# The two-speed classes of the repository's file, each with two ranks on one core.
sed -e "s|base = \"cpu-local.toml\"|base = \"$src/clusters/cpu-local.toml\"|" -e 's/^devices = 1/devices = 2/' \
  "$src/clusters/cpu-two-speeds.toml" >mixed.toml
grep -q 'devices = 2' mixed.toml || fail "could not derive the two-rank classes from cpu-two-speeds.toml"
"$plan" --cluster mixed.toml --model tiny --precision fp32 --pp 2 --dp 2 --zero 0 --emit-config run.toml >plan.out 2>&1 ||
  { cat plan.out; fail "triax-plan"; }
layers=$(sed -n 's/^pipeline-layers = \[\(.*\)\]/\1/p' run.toml)
shares=$(sed -n 's/^dp-microbatches = "\(.*\)"/\1/p' run.toml)
gb=$(sed -n 's/^global-batch-size = //p' run.toml)
python3 - "$layers" "$shares" <<'PY' || { cat run.toml; fail "the plan is not uneven in both stages and shares"; }
import sys
layers = [int(v) for v in sys.argv[1].split(",")]
shares = [int(v) for v in sys.argv[2].split(",")]
assert len(layers) == 2 and layers[0] != layers[1], layers
assert len(shares) == 2 and shares[0] != shares[1], shares
PY
echo "ok: plan $(sed -n 2p run.toml | sed 's/^# *//')"
# The launch line the file gives, with this build's train_gpt and 3 iterations.
launch=$(sed -n 's/^#   mpirun //p' run.toml)
[ -n "$launch" ] || fail "run.toml names no launch line"
launch=${launch//train_gpt --config run.toml/$exe --config run.toml --train-iters 3 --seed 1 --metrics-jsonl het.jsonl}
# shellcheck disable=SC2086
run $launch >het.out 2>&1 || { tail -20 het.out; fail "train_gpt under the plan's launch line"; }
grep -q "device classes (TRIAX_DEVICE_CLASS): fast: ranks .*slow: ranks" het.out || fail "the classes are not reported"
# One process: the same file (model, sequence, batch) without the layout.
grep -v -E '^(tp|pp|dp|pipeline-layers|stage-classes|dp-microbatches) = ' run.toml >one.toml
run -np 1 "$exe" --config one.toml --train-iters 3 --seed 1 --metrics-jsonl one.jsonl >one.out 2>&1 ||
  { tail -5 one.out; fail "one process"; }
compare_losses one.jsonl het.jsonl
echo "ok: layers [$layers], shares [$shares], global batch $gb: the one-process losses"
