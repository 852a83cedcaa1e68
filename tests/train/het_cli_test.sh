#!/usr/bin/env bash
# Heterogeneous clusters through train_gpt (issue 29, docs/HETEROGENEOUS.md), each rank's class from
# TRIAX_DEVICE_CLASS set per mpirun app context (MPMD: ranks numbered in context order):
#   e2e:    --dp-microbatches fast=3,slow=1 at dp 2, --pp 2 --stage-classes fast,slow with uneven
#           --pipeline-layers 3,1, and both at np 4 (pp 2 x dp 2, shares 1,3 per replica) train the
#           one-process losses and gradient norms (--metrics-jsonl, 1e-5 relative) of the same
#           global batch; the start-up configuration names the classes and the shares.
#   errors: a bad TRIAX_DEVICE_CLASS, a stage on ranks of another class (the message names them), a
#           replica's class not in --dp-microbatches, uneven shares under ZeRO 2 and with
#           --num-micro-batches: exit 2, the message once per job, no hang.
#   het_cli_test.sh TRAIN_GPT MPIEXEC CASE
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1  # flight-recorder dumps of the failing runs land here
fail() { echo "FAIL ($case_): $*"; exit 1; }
run() { timeout 120 "$mpiexec" --oversubscribe "$@"; }

# The same small run everywhere: nano, 4 layers, 8-token samples, micro-batch 1, 3 iterations.
small="--model nano --num-layers 4 --seq-length 8 --micro-batch-size 1 --train-iters 3 --seed 1 --lr 1e-3"

# mpmd NP_FAST NP_SLOW ARGS...: fast ranks first, then slow ones, every rank the same ARGS.
mpmd() {
  local nf=$1 ns=$2; shift 2
  run -np "$nf" -x TRIAX_DEVICE_CLASS=fast "$exe" "$@" : -np "$ns" -x TRIAX_DEVICE_CLASS=slow "$exe" "$@"
}

. "$(dirname "${BASH_SOURCE[0]}")/train_lib.sh"  # expect_exit, compare_losses

case $case_ in
e2e)
  # name|global batch|fast ranks|slow ranks|layout flags
  for c in "dp|4|1|1|--dp-microbatches fast=3,slow=1" \
           "pp|4|1|1|--pp 2 --stage-classes fast,slow --pipeline-layers 3,1" \
           "pp_dp|4|2|2|--pp 2 --stage-classes fast,slow --pipeline-layers 3,1 --dp-microbatches 1,3"; do
    IFS='|' read -r name gb nf ns flags <<<"$c"
    run -np 1 "$exe" $small --global-batch-size "$gb" --metrics-jsonl "$tmp/one_$name.jsonl" >"$tmp/one.out" 2>&1 ||
      { tail -5 "$tmp/one.out"; fail "one process ($name)"; }
    # shellcheck disable=SC2086
    mpmd "$nf" "$ns" $small --global-batch-size "$gb" $flags --metrics-jsonl "$tmp/$name.jsonl" >"$tmp/$name.out" 2>&1 ||
      { tail -5 "$tmp/$name.out"; fail "$name: $flags"; }
    grep -q "^# device classes (TRIAX_DEVICE_CLASS): fast: ranks 0$( [ "$nf" = 2 ] && echo -1), slow: ranks" "$tmp/$name.out" ||
      { grep "device classes" "$tmp/$name.out"; fail "$name: the start-up lines do not name the classes"; }
    case $flags in *dp-microbatches*)
      grep -q "^dp-microbatches = \"" "$tmp/$name.out" || fail "$name: the resolved configuration lacks dp-microbatches";;
    esac
    echo "$name ($flags):"
    compare_losses "$tmp/one_$name.jsonl" "$tmp/$name.jsonl"
  done
  ;;
errors)
  expect_exit 2 "TRIAX_DEVICE_CLASS='a b': the character ' '" \
    -np 1 "$exe" $small --train-iters 1 : -np 1 env "TRIAX_DEVICE_CLASS=a b" "$exe" $small --train-iters 1
  expect_exit 2 "stage 0 should run on 'slow' but holds 'fast' (ranks 0)" \
    -np 1 -x TRIAX_DEVICE_CLASS=fast "$exe" $small --pp 2 --stage-classes slow,fast : \
    -np 1 -x TRIAX_DEVICE_CLASS=slow "$exe" $small --pp 2 --stage-classes slow,fast
  expect_exit 2 "does not name class 'slow' of data-parallel replica 1" \
    -np 1 -x TRIAX_DEVICE_CLASS=fast "$exe" $small --dp-microbatches fast=3 : \
    -np 1 -x TRIAX_DEVICE_CLASS=slow "$exe" $small --dp-microbatches fast=3
  expect_exit 2 "--zero 2 reduce-scatters each unit once per micro-batch" -np 2 "$exe" $small --dp-microbatches 3,1 --zero 2
  expect_exit 2 "drop --num-micro-batches 2" -np 2 "$exe" $small --dp-microbatches 3,1 --num-micro-batches 2
  expect_exit 2 "counts per replica mixed with counts per class" -np 2 "$exe" $small --dp-microbatches 3,slow=1
  ;;
*) fail "unknown case" ;;
esac
echo "het $case_: ok"
