#!/usr/bin/env bash
# MoE and checkpoints under context parallelism through train_gpt (issue 28, docs/MOE.md
# "Context parallelism", docs/CHECKPOINTS.md).
#   moe:        --moe-every 2 --no-drop with --moe-aux-coef 1 (the aux gradient weighs in) at cp 2
#               and cp 4, p2p and allgather, at ep 2 x dp 2 x cp 2 and x cp 4, and cp 2 with pp 2 or
#               tp 2: every iteration's loss and aux loss equal one process's (<= 1e-5); ZeRO-2 and 3
#               at ep 2 x dp 2 x cp 4 (micro-batch 1) train the same (no hang); drop mode with a
#               capacity that drops nothing (factor E / k) at cp 2 equals one process too.
#   checkpoint: saved at iteration 3 under cp 2 (ZeRO 0, 1, 3; MoE with ep 2, ZeRO 0 and 3),
#               resumed at cp 1 and cp 4: the six losses equal the uninterrupted one-process run (<= 1e-5).
#   cp_moe_test.sh TRAIN_GPT MPIEXEC CASE
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL ($case_): $*"; exit 1; }

# train NP OUT args...: train_gpt on NP ranks, metrics to OUT.jsonl (fails on an error or a timeout).
train() {
  local np=$1 out=$2; shift 2
  timeout 300 "$mpiexec" --oversubscribe -np "$np" "$exe" "$@" --metrics-jsonl "$out.jsonl" >"$out.log" 2>&1 ||
    { tail -5 "$out.log"; fail "-np $np $* exited or timed out"; }
}
# same A B KEYS...: the metrics files have as many lines and each KEY agrees within 1e-5.
same() {
  python3 - "$@" <<'PY' || fail "$1 and $2 differ"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) > 0, (len(a), len(b))
for k in sys.argv[3:]:
    d = max(abs(x[k] - y[k]) for x, y in zip(a, b))
    print(f"  {sys.argv[2]}: {k} max difference {d:.3g} over {len(a)} iterations")
    assert d <= 1e-5, (k, [x[k] for x in a], [y[k] for y in b])
PY
}

case $case_ in
moe)
  base=(--model tiny --moe-every 2 --no-drop --moe-aux-coef 1 --global-batch-size 4 --micro-batch-size 2
        --train-iters 3 --seed 1 --seq-length 64)
  train 1 one "${base[@]}"
  for v in "2:--cp 2" "2:--cp 2 --cp-comm-type allgather" "4:--cp 4" "4:--cp 4 --cp-comm-type allgather" \
           "4:--ep 2 --dp 2 --cp 2" "8:--ep 2 --dp 2 --cp 4" "4:--cp 2 --pp 2" "4:--cp 2 --tp 2"; do
    train "${v%%:*}" cp ${base[@]} ${v#*:}
    same one.jsonl cp.jsonl loss moe_aux_loss
    echo "ok: -np ${v%%:*} ${v#*:} trains the one-process losses and aux losses"
  done
  # ZeRO-2 and 3 with ep 2 x dp 2 x cp 4, micro-batch 1: some micro-batches route no rows to a
  # rank's experts; that rank must still gather their weights and reduce-scatter their (zero)
  # gradients with its expert shard group, in the same order as its peers (both hung at iteration
  # 2 before MoeMlp fetched every expert's views before the exchange).
  one1=(--model tiny --moe-every 2 --no-drop --global-batch-size 4 --micro-batch-size 1 --train-iters 3 --seed 1
        --seq-length 64)
  train 1 one1 "${one1[@]}"
  for z in 2 3; do
    train 8 z$z "${one1[@]}" --ep 2 --dp 2 --cp 4 --zero $z --stall-timeout 60
    same one1.jsonl z$z.jsonl loss moe_aux_loss
    echo "ok: -np 8 --ep 2 --dp 2 --cp 4 --zero $z trains the one-process losses"
  done
  drop=(--model tiny --moe-every 2 --experts 8 --topk 2 --capacity-factor 4 --moe-aux-coef 1 --global-batch-size 4
        --micro-batch-size 2 --train-iters 3 --seed 1 --seq-length 64)
  train 1 drop1 "${drop[@]}"
  train 2 drop2 "${drop[@]}" --cp 2
  same drop1.jsonl drop2.jsonl loss moe_aux_loss
  echo "ok: drop mode with nothing dropped (capacity factor E / k) at cp 2 equals one process"
  ;;
checkpoint)
  run_case() {  # run_case NAME NP_ONE SAVE_NP RESUMES args...: RESUMES "np:flags,np:flags"
    local name=$1 np1=$2 save=$3 resumes=$4; shift 4
    train "$np1" "$name-straight" "$@" --train-iters 6
    train "${save%%:*}" "$name-first" "$@" ${save#*:} --train-iters 3 --save "$name-ck"
    grep -q '"cp": 2' "$name-ck/iter_0000003/manifest.json" || fail "$name: the manifest does not record cp 2"
    IFS=, read -ra rs <<<"$resumes"
    for r in "${rs[@]}"; do
      train "${r%%:*}" "$name-resumed" "$@" ${r#*:} --train-iters 6 --load "$name-ck"
      grep -q "resumed from" "$name-resumed.log" || fail "$name: -np $r did not resume"
      cat "$name-first.jsonl" "$name-resumed.jsonl" >"$name-both.jsonl"
      same "$name-straight.jsonl" "$name-both.jsonl" loss
      echo "ok: $name saved at -np ${save%%:*} ${save#*:}, resumed at -np ${r%%:*} ${r#*:}: the uninterrupted losses"
    done
  }
  base=(--model tiny --global-batch-size 4 --micro-batch-size 2 --lr-decay-iters 6 --seed 1 --seq-length 64)
  for z in 0 1 3; do
    run_case "zero$z" 1 "2:--cp 2 --zero $z" "1:--zero $z,4:--cp 4 --zero $z" "${base[@]}"
  done
  moe=(--model tiny --moe-every 2 --no-drop --ep 2 --global-batch-size 4 --micro-batch-size 1 --lr-decay-iters 6
       --seed 1 --seq-length 64)
  run_case moe 2 "4:--cp 2" "2:,8:--cp 4" "${moe[@]}"
  run_case moe_zero3 2 "4:--cp 2 --zero 3" "2:--zero 3,8:--cp 4 --zero 3" "${moe[@]}" --stall-timeout 60
  ;;
*) fail "unknown case" ;;
esac
echo "ok ($case_)"
