#!/usr/bin/env bash
# Checkpoints end to end under mpirun (docs/CHECKPOINTS.md): exact resume bit for bit, resharded
# resume onto other layouts, a kill -9 during a save, SIGTERM mid-run, --init-from / --export-hf,
# bad checkpoints refused with a fallback to the previous one, pruning after a fallback, wide
# iteration numbers, batch settings on resume, and the start-up checks of --save / --load.
#   checkpoint_test.sh TRAIN_GPT MPIEXEC CASE [GPT_EVAL HF_PYTHON]
set -uo pipefail
exe=$1; mpiexec=$2; case_=$3; gpt_eval=${4:-}; hf_python=${5:-/usr/bin/python3}
scripts=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../scripts" && pwd)
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
# forge.py DIR PYTHON: runs PYTHON on m (DIR/manifest.json) and rewrites the manifest and its
# digest as triax would (a forged digest: what is behind the digest must refuse the change).
forge=$tmp/forge.py
cat >"$forge" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
exec(sys.argv[2])
text = json.dumps(m, indent=1)
open(os.path.join(d, "manifest.json"), "w").write(text)
open(os.path.join(d, "manifest.sha256"), "w").write(hashlib.sha256(text.encode()).hexdigest() + "  manifest.json\n")
PY
# The rank processes of a background `timeout mpirun` started as PID (grandchildren of PID).
ranks_of() { local m; m=$(pgrep -P "$1" | head -n 1); [ -n "$m" ] && pgrep -P "$m"; }

case $case_ in
exact)
  # 8 iterations straight vs 4 + save + resume + 4, at tp2 x pp2 x dp2, with ZeRO-1, ZeRO-2,
  # ZeRO-3 and with overlapped DP all-reduce: the same losses and the same saved state, bit for bit.
  for variant in zero1 zero2 zero3 overlap; do
    extra=(--tp 2 --pp 2); [ $variant != overlap ] && extra+=(--zero "${variant#zero}")
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
llama)
  # Issue 26: a model of the Llama block (RMSNorm, SwiGLU, RoPE, 8 query heads over 4 key/value
  # heads, no biases), untied head and tied: 8 iterations straight vs 4 + save + resume + 4 at
  # tp2 x pp2 x dp2 with ZeRO-1, bit for bit (losses and saved state); then the half-way checkpoint
  # resumed resharded onto other layouts (tp 4 splits the 4 key/value heads one per rank; the
  # padded vocabulary rows of the embedding and of the untied head are cut and zero-extended).
  lbase=(--model llama-nano --num-layers 4 --micro-batch-size 4 --global-batch-size 32 --train-iters 8 --lr-decay-iters 8)
  for head in untied tied; do
    lb=("${lbase[@]}"); [ $head = tied ] && lb+=(--untie-embeddings-and-output-weights=false)
    run -np 8 "$exe" "${lb[@]}" --tp 2 --pp 2 --zero1 --save "straight_$head" --metrics-jsonl a.jsonl >a.log 2>&1 ||
      { tail -5 a.log; fail "straight Llama run ($head)"; }
    grep -q 'normalization = "RMSNorm"' a.log || { head -20 a.log; fail "not the Llama block ($head)"; }
    run -np 8 "$exe" "${lb[@]}" --tp 2 --pp 2 --zero1 --train-iters 4 --save "half_$head" --metrics-jsonl b.jsonl \
      >b.log 2>&1 || { tail -5 b.log; fail "first half ($head)"; }
    run -np 8 "$exe" "${lb[@]}" --tp 2 --pp 2 --zero1 --load "half_$head" --save "resumed_$head" --metrics-jsonl c.jsonl \
      >c.log 2>&1 || { tail -5 c.log; fail "resumed run ($head)"; }
    grep -q "resumed from half_$head/iter_0000004: iteration 4" c.log || { tail -5 c.log; fail "no resume ($head)"; }
    cat b.jsonl c.jsonl >bc.jsonl
    same_losses a.jsonl bc.jsonl 0
    same_state "straight_$head/iter_0000008" "resumed_$head/iter_0000008"
    ok "exact Llama resume ($head head)"
    tail -n 4 a.jsonl >a_tail.jsonl
    layouts=("8 --tp 4 --pp 1" "2 --tp 1 --pp 1" "4 --tp 1 --pp 2 --vpp 2 --schedule interleaved")
    [ $head = untied ] && layouts+=("8 --tp 1 --pp 4" "4 --tp 2 --pp 2 --pipeline-layers 1,3 --zero1")
    for layout in "${layouts[@]}"; do
      set -- $layout; np=$1; shift
      rm -f r.jsonl
      run -np "$np" "$exe" "${lb[@]}" "$@" --load "half_$head" --metrics-jsonl r.jsonl >r.log 2>&1 ||
        { tail -5 r.log; fail "Llama resume at $layout ($head)"; }
      grep -q "resumed from half_$head/iter_0000004" r.log || fail "no resume at $layout ($head)"
      same_losses a_tail.jsonl r.jsonl 1e-5
      ok "resharded Llama resume at np $layout ($head head)"
    done
  done
  # Resuming with another block is refused naming the field (every checkpoint: none can be loaded).
  out=$(run -np 2 "$exe" "${lbase[@]}" --swiglu=false --load half_untied 2>&1) && fail "a GELU run resumed a SwiGLU checkpoint"
  grep -q "swiglu (--swiglu): true in the checkpoint, false in this run" <<<"$out" || { echo "$out" | tail -5; fail "no swiglu mismatch"; }
  ok "another block refused, naming the field"
  ;;
kill9)
  # kill -9 of one rank while a save is in flight (the write is held back 1.5 s by the test hook):
  # that checkpoint stays an incomplete .tmp directory and --load uses the previous one.
  TRIAX_CHECKPOINT_TEST_DELAY_MS=1500 timeout 300 "$mpiexec" --oversubscribe -np 4 "$exe" "${base[@]}" --tp 2 --pp 2 \
    --train-iters 40 --lr-decay-iters 40 --save ck --save-interval 2 >run.log 2>&1 &
  mpid=$!
  for _ in $(seq 600); do [ -f ck/iter_0000002/manifest.json ] && [ -d ck/iter_0000004.tmp ] && break; sleep 0.05; done
  [ -d ck/iter_0000004.tmp ] || { kill $mpid; tail -5 run.log; fail "the second save never started"; }
  victim=$(ranks_of $mpid | tail -n 1)
  [ -n "$victim" ] || fail "no rank process under mpirun $mpid"
  kill -9 "$victim"
  wait $mpid && fail "mpirun exited 0 after a rank was killed"
  [ ! -f ck/iter_0000004/manifest.json ] || fail "the interrupted save was committed"
  run -np 4 "$exe" "${base[@]}" --tp 2 --pp 2 --load ck --save ck --train-iters 5 --lr-decay-iters 40 >r.log 2>&1 ||
    { tail -5 r.log; fail "resume after the crash"; }
  grep -q "resumed from ck/iter_0000002: iteration 2" r.log || { tail -5 r.log; fail "did not resume from iteration 2"; }
  [ -f ck/iter_0000005/manifest.json ] || fail "no checkpoint after the resumed run"
  [ ! -e ck/iter_0000004.tmp ] || fail "the next save left the crashed save's iter_0000004.tmp"
  ok "killed rank during a save: resumed from the previous checkpoint (iteration 2)"
  ;;
sigterm)
  # SIGTERM to one rank mid-run: every rank finishes the iteration, saves, exits 0; resuming
  # continues the loss curve of an uninterrupted run.
  long=(--tp 2 --pp 2 --lr-decay-iters 400)
  timeout 300 "$mpiexec" --oversubscribe -np 4 "$exe" "${base[@]}" "${long[@]}" --train-iters 400 --save ck \
    --metrics-jsonl b.jsonl >run.log 2>&1 &
  mpid=$!
  for _ in $(seq 600); do [ -f b.jsonl ] && [ "$(wc -l <b.jsonl)" -ge 3 ] && break; sleep 0.05; done
  victim=$(ranks_of $mpid | head -n 1)
  [ -n "$victim" ] || fail "no rank process under mpirun $mpid"
  kill -TERM "$victim"
  wait $mpid; rc=$?
  [ $rc -eq 0 ] || { tail -5 run.log; fail "exit $rc after SIGTERM, expected 0"; }
  k=$(grep -o "received SIGTERM: saved the state of iteration [0-9]*" run.log | grep -o "[0-9]*$")
  [ -n "$k" ] || { tail -5 run.log; fail "no save-and-exit message"; }
  [ "$k" -lt 400 ] || fail "the run was not interrupted"
  [ -f "ck/$(printf 'iter_%07d' "$k")/manifest.json" ] || fail "no checkpoint of iteration $k"
  [ "$(wc -l <b.jsonl)" -eq "$k" ] || fail "metrics hold $(wc -l <b.jsonl) iterations, the save says $k"
  n=$((k + 3))
  run -np 4 "$exe" "${base[@]}" "${long[@]}" --train-iters $n --load ck --metrics-jsonl c.jsonl >c.log 2>&1 || fail "resume"
  run -np 4 "$exe" "${base[@]}" "${long[@]}" --train-iters $n --metrics-jsonl a.jsonl >a.log 2>&1 || fail "straight run"
  cat b.jsonl c.jsonl >bc.jsonl
  same_losses a.jsonl bc.jsonl 0
  ok "SIGTERM at iteration $k: saved, exit 0, resumed bit for bit"
  ;;
sigusr1)
  # SIGUSR1 (Slurm's --signal=USR1@T) to every rank: the same save and exit 0.
  timeout 300 "$mpiexec" --oversubscribe -np 2 "$exe" "${base[@]}" --tp 2 --train-iters 400 --lr-decay-iters 400 --save ck \
    --metrics-jsonl b.jsonl >run.log 2>&1 &
  mpid=$!
  for _ in $(seq 600); do [ -f b.jsonl ] && [ "$(wc -l <b.jsonl)" -ge 2 ] && break; sleep 0.05; done
  pids=$(ranks_of $mpid)
  [ -n "$pids" ] || fail "no rank process under mpirun"
  kill -USR1 $pids
  wait $mpid; rc=$?
  [ $rc -eq 0 ] || { tail -5 run.log; fail "exit $rc after SIGUSR1, expected 0"; }
  k=$(grep -o "received SIGUSR1: saved the state of iteration [0-9]*" run.log | grep -o "[0-9]*$")
  [ -n "$k" ] && [ -f "ck/$(printf 'iter_%07d' "$k")/manifest.json" ] || { tail -5 run.log; fail "no save on SIGUSR1"; }
  ok "SIGUSR1 at iteration $k: saved, exit 0"
  ;;
moe|moe_llama)
  # MoE layers (experts split over ep, replicated over tp): 8 straight = 4 + save + resume + 4 at
  # dp 4 ep 2 bit for bit, then the ep 2 checkpoint resumed at ep 4, at ep 1 with ZeRO-1, at tp 2
  # x dp 2 and on a pp 2 pipeline: the straight run's losses (no-drop routing: layout-free).
  # moe_llama: the same with the Llama block and Mixtral-shaped experts (SwiGLU, no biases, HF names).
  moe=(--moe-every 2 --experts 4 --topk 2 --no-drop)
  if [ "$case_" = moe_llama ]; then
    base=(--model llama-nano --num-layers 4 --micro-batch-size 4 --global-batch-size 32 --train-iters 8 --lr-decay-iters 8)
  fi
  run -np 4 "$exe" "${base[@]}" "${moe[@]}" --ep 2 --save straight --metrics-jsonl a.jsonl >a.log 2>&1 ||
    { tail -5 a.log; fail "straight MoE run"; }
  tail -n 4 a.jsonl >a_tail.jsonl
  run -np 4 "$exe" "${base[@]}" "${moe[@]}" --ep 2 --train-iters 4 --save ck --metrics-jsonl b.jsonl >b.log 2>&1 ||
    { tail -5 b.log; fail "first half"; }
  python3 - ck/iter_0000004/manifest.json "$case_" <<'PY' || fail "the manifest lacks experts"
import json, sys
names = {s["name"] for s in json.load(open(sys.argv[1]))["slices"]}
if sys.argv[2] == "moe":
    experts = {n for n in names if ".moe.experts." in n}
    want = {f"transformer.h.{l}.moe.experts.{e}.{p}" for l in (1, 3) for e in range(4)
            for p in ("c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias")}
else:
    experts = {n for n in names if ".block_sparse_moe.experts." in n}
    want = {f"model.layers.{l}.block_sparse_moe.experts.{e}.{p}.weight" for l in (1, 3) for e in range(4)
            for p in ("w1", "w3", "w2")}
    routers = {n for n in names if n.endswith(".block_sparse_moe.gate.weight")}
    assert routers == {f"model.layers.{l}.block_sparse_moe.gate.weight" for l in (1, 3)}, sorted(routers)
assert experts == want, (sorted(want - experts), sorted(experts - want))
print(f"{len(experts)} expert tensors in the manifest")
PY
  run -np 4 "$exe" "${base[@]}" "${moe[@]}" --ep 2 --load ck --save ck2 --metrics-jsonl c.jsonl >c.log 2>&1 ||
    { tail -5 c.log; fail "resumed MoE run"; }
  cat b.jsonl c.jsonl >bc.jsonl
  same_losses a.jsonl bc.jsonl 0
  same_state straight/iter_0000008 ck2/iter_0000008
  ok "exact MoE resume at dp 4 ep 2"
  for layout in "4 --ep 4" "4 --ep 1 --zero1" "4 --tp 2 --ep 2" "2 --pp 2 --ep 1"; do
    set -- $layout; np=$1; shift
    rm -f r.jsonl
    run -np "$np" "$exe" "${base[@]}" "${moe[@]}" "$@" --load ck --metrics-jsonl r.jsonl >r.log 2>&1 ||
      { tail -5 r.log; fail "MoE resume at $layout"; }
    grep -q "resumed from ck/iter_0000004" r.log || { tail -3 r.log; fail "no resume at $layout"; }
    same_losses a_tail.jsonl r.jsonl 1e-5
    ok "resharded MoE resume at np $layout"
  done
  ;;
bad)
  # Broken checkpoints are refused naming the file and the problem; --load falls back to the
  # previous complete one. An absent directory starts fresh; all broken is an error.
  small=(--model nano --micro-batch-size 4 --global-batch-size 16 --lr-decay-iters 8)
  run -np 2 "$exe" "${small[@]}" --train-iters 4 --save ck --save-interval 2 --keep-last 0 >s.log 2>&1 || fail "saving run"
  [ -f ck/iter_0000002/manifest.json ] && [ -f ck/iter_0000004/manifest.json ] || fail "expected two checkpoints"
  run -np 2 "$exe" "${small[@]}" --train-iters 4 --save keep --save-interval 1 --keep-last 2 >k.log 2>&1 || fail "keep-last run"
  [ "$(ls keep | tr '\n' ' ')" = "iter_0000003 iter_0000004 " ] || fail "--keep-last 2 left: $(ls keep | tr '\n' ' ')"
  ok "--keep-last 2 keeps the newest two"
  out=$(run -np 2 "$exe" "${small[@]}" --train-iters 5 --load nowhere 2>&1) || fail "absent --load directory"
  grep -q "no complete checkpoint there .*starting fresh" <<<"$out" || fail "no fresh-start message"
  corrupt() {  # corrupt NAME PATTERN COMMAND...: break ck copy's iteration 4, expect PATTERN and the fallback
    local name=$1 pattern=$2; shift 2
    rm -rf "c_$name"; cp -r ck "c_$name"
    (cd "c_$name/iter_0000004" && "$@") || fail "could not corrupt ($name)"
    out=$(run -np 2 "$exe" "${small[@]}" --train-iters 5 --load "c_$name" 2>&1) || { echo "$out" | tail -5; fail "load ($name) failed"; }
    grep -q -- "$pattern" <<<"$out" || { echo "$out" | grep -i "refused\|error" ; fail "no '$pattern' ($name)"; }
    grep -q "falling back to the previous checkpoint c_$name/iter_0000002" <<<"$out" || fail "no fallback message ($name)"
    grep -q "resumed from c_$name/iter_0000002: iteration 2" <<<"$out" || fail "did not resume from iteration 2 ($name)"
    ok "$name: '$pattern', fell back to iteration 2"
  }
  # edit PYTHON: change manifest.json and forge its digest, to reach the checks behind the digest.
  edit() { python3 "$forge" . "$1"; }
  corrupt truncated "rank_00001.bin: .* bytes, but the manifest lists .* (truncated)" truncate -s -5 rank_00001.bin
  corrupt flipped "rank_00000.bin: SHA-256 mismatch" python3 -c "
f=open('rank_00000.bin','r+b'); f.seek(100); b=f.read(1); f.seek(100); f.write(bytes([b[0]^1]))"
  corrupt missing "rank_00001.bin: missing shard file" rm rank_00001.bin
  corrupt newer "format version 4 is newer than this build of triax reads" edit "m['format_version']=4"
  corrupt model "a checkpoint of another model" edit "m['model']['n_layer']=3"
  corrupt block "norm (--normalization): RMSNorm in the checkpoint, LayerNorm in this run" edit "m['model']['norm']='RMSNorm'"
  corrupt layout "cannot be split over tp 3" edit "m['slices'][0]['tp_size']=3"
  corrupt no_slice "slices must tile the file" \
    edit "m['slices']=[s for s in m['slices'] if not (s['name']=='transformer.ln_f.bias' and s['kind']=='exp_avg')]"
  # The manifest's own integrity (issue 24): one digit edited without the digest, a digest
  # removed, a manifest of another iteration, and (digest forged) each structure check.
  corrupt digest "manifest.sha256: SHA-256 mismatch: manifest.json hashes to" \
    python3 -c "import re; t=open('manifest.json').read(); open('manifest.json','w').write(re.sub(r'\"offset\": 8\\b', '\"offset\": 9', t, count=1))"
  corrupt no_digest "manifest.sha256: missing: a version 3 checkpoint" rm manifest.sha256
  corrupt other_iteration "iteration 2, but the directory is named for iteration 4" cp ../iter_0000002/manifest.json ../iter_0000002/manifest.sha256 .
  corrupt unaligned "offset .* is not a multiple of 4" edit "m['slices'][1]['offset']+=2"
  corrupt overlap "two slices overlap" edit "m['slices'][1]['offset']-=4"
  corrupt iteration "applied_steps 4 + skipped_steps 0 != iteration 5" edit "m['iteration']=5"
  corrupt consumed "consumed_samples 80 != 64" edit "m['consumed_samples']=80"
  corrupt batch "global_batch 32 != micro_batch 4 x dp 2 x num_micro_batches 2" edit "m['batch']['global_batch']=32"
  # The ZeRO level (issue 27): out of range, or contradicting zero1 (which old readers read).
  corrupt zero_level "layout.zero = 7 is out of range \[0, 3\]" edit "m['layout']['zero']=7"
  corrupt zero1 "layout.zero1 = true contradicts layout.zero = 0" edit "m['layout']['zero1']=True"
  # A version 1 checkpoint (before digests and batch settings): loaded, with a warning.
  rm -rf v1; cp -r ck v1; (cd v1/iter_0000004 && rm manifest.sha256 && python3 -c "
import json; m=json.load(open('manifest.json')); m['format_version']=1; del m['batch']
for k in ['n_kv_head', 'norm', 'norm_eps', 'swiglu', 'positions', 'rope_theta', 'rope_scaling', 'bias']: del m['model'][k]
json.dump(m, open('manifest.json','w'))")
  out=$(run -np 2 "$exe" "${small[@]}" --train-iters 5 --load v1 2>&1) || { echo "$out" | tail -5; fail "version 1 load"; }
  grep -q "resumed from v1/iter_0000004: iteration 4" <<<"$out" || fail "the version 1 checkpoint was not loaded"
  grep -q "no manifest.sha256 (written by a triax before manifest digests" <<<"$out" || fail "no version 1 warning"
  ok "version 1 without a digest: loaded with a warning"
  rm -rf both; cp -r ck both; rm both/iter_0000004/rank_00000.bin; truncate -s 10 both/iter_0000002/rank_00001.bin
  out=$(run -np 2 "$exe" "${small[@]}" --train-iters 5 --load both 2>&1) && fail "all checkpoints broken, yet exit 0"
  grep -q "none of its 2 checkpoints can be loaded" <<<"$out" || { echo "$out" | tail -3; fail "no final error"; }
  ok "every checkpoint broken: refused"
  ;;
prune)
  # Issue 24: iteration 2 good, iteration 4 damaged; a resume falls back to 2, saves 3 with
  # --keep-last 1: 2 (resumed from) and 3 stay, 4 is set aside as iter_0000004.refused, and the
  # next --load resumes from 3. (Before the fix only the damaged 4 was left.)
  small=(--model nano --micro-batch-size 4 --global-batch-size 16 --lr-decay-iters 8)
  run -np 2 "$exe" "${small[@]}" --train-iters 4 --save ck --save-interval 2 --keep-last 0 >s.log 2>&1 || fail "saving run"
  truncate -s -5 ck/iter_0000004/rank_00001.bin
  run -np 2 "$exe" "${small[@]}" --load ck --save ck --keep-last 1 --train-iters 3 >r.log 2>&1 || { tail -5 r.log; fail "resume"; }
  grep -q "resumed from ck/iter_0000002: iteration 2" r.log || { tail -5 r.log; fail "no fallback to 2"; }
  [ "$(ls ck | tr '\n' ' ')" = "iter_0000002 iter_0000003 iter_0000004.refused " ] || fail "left: $(ls ck | tr '\n' ' ')"
  grep -q "set aside ck/iter_0000004 as ck/iter_0000004.refused: it failed verification" r.log || fail "no set-aside message"
  grep -q "kept ck/iter_0000002 beyond --keep-last 1: this run resumed from it" r.log || fail "no kept message"
  run -np 2 "$exe" "${small[@]}" --load ck --save ck --keep-last 1 --train-iters 4 >n.log 2>&1 || { tail -5 n.log; fail "next resume"; }
  grep -q "resumed from ck/iter_0000003: iteration 3" n.log || { tail -5 n.log; fail "did not resume from 3"; }
  [ "$(ls ck | tr '\n' ' ')" = "iter_0000003 iter_0000004 iter_0000004.refused " ] || fail "then left: $(ls ck | tr '\n' ' ')"
  ok "--keep-last 1 after a fallback kept the resumed and the new checkpoint, set the damaged one aside"
  ;;
wide)
  # Iterations past 9,999,999 (8-digit directory names): listed, loaded, pruned. The checkpoint
  # of iteration 2 is rewritten as iteration 10,000,000 (steps and consumed samples to match).
  small=(--model nano --micro-batch-size 4 --global-batch-size 16 --lr-decay-iters 8)
  run -np 2 "$exe" "${small[@]}" --train-iters 2 --save ck >s.log 2>&1 || fail "saving run"
  cp -r ck/iter_0000002 ck/iter_10000000
  python3 "$forge" ck/iter_10000000 "n=10000000; m['iteration']=n; m['applied_steps']=n; m['consumed_samples']=16*n" ||
    fail "forge"
  run -np 2 "$exe" "${small[@]}" --load ck --save ck --keep-last 1 --train-iters 10000001 >r.log 2>&1 ||
    { tail -5 r.log; fail "resume from iteration 10000000"; }
  grep -q "resumed from ck/iter_10000000: iteration 10000000" r.log || { tail -5 r.log; fail "iteration 10000000 not loaded"; }
  [ -f ck/iter_10000001/manifest.json ] || fail "no iter_10000001"
  run -np 2 "$exe" "${small[@]}" --load ck --save ck --keep-last 1 --train-iters 10000002 >n.log 2>&1 ||
    { tail -5 n.log; fail "resume from iteration 10000001"; }
  grep -q "resumed from ck/iter_10000001: iteration 10000001" n.log || { tail -5 n.log; fail "iteration 10000001 not loaded"; }
  [ "$(ls ck | tr '\n' ' ')" = "iter_10000001 iter_10000002 " ] || fail "--keep-last 1 left: $(ls ck | tr '\n' ' ')"
  ok "iter_10000000 listed and loaded, iter_10000001 written, the older ones pruned"
  ;;
batch)
  # Issue 24: saved at dp 2 without batch flags (global batch 4 x dp 2 x 2 = 16), resumed at dp 1:
  # the checkpoint's global batch and micro-batch are kept (said in the log), and the loss of the
  # resumed iteration is the straight dp 2 run's. Batch flags given on resume win, announced.
  nb=(--model nano --lr-decay-iters 8)
  run -np 2 "$exe" "${nb[@]}" --train-iters 3 --metrics-jsonl a.jsonl >a.log 2>&1 || fail "straight run"
  tail -n 1 a.jsonl >a_tail.jsonl
  run -np 2 "$exe" "${nb[@]}" --train-iters 2 --save ck >s.log 2>&1 || fail "saving run"
  run -np 1 "$exe" "${nb[@]}" --train-iters 3 --load ck --metrics-jsonl r.jsonl >r.log 2>&1 || { tail -5 r.log; fail "resume at dp 1"; }
  grep -q "batch settings from ck/iter_0000002 (not given for this run): --global-batch-size 16 --micro-batch-size 4" r.log ||
    { grep -i batch r.log; fail "no batch message"; }
  python3 -c "import json,sys; g=json.loads(open('r.jsonl').read())['global_batch_size']; sys.exit(g!=16 and f'global batch {g}')" ||
    fail "the resumed run's global batch is not 16"
  same_losses a_tail.jsonl r.jsonl 1e-5
  run -np 1 "$exe" "${nb[@]}" --train-iters 3 --load ck --global-batch-size 8 >e.log 2>&1 || { tail -5 e.log; fail "resume with flags"; }
  grep -q "the batch settings change on resume: the checkpoint was trained with global batch 16, micro-batch 4, this run uses global batch 8, micro-batch 4" e.log ||
    { grep -i batch e.log; fail "no batch change message"; }
  ok "dp 2 -> dp 1 kept global batch 16 (same loss); a flag's change announced"
  ;;
startup)
  # Late or unclear errors of the checkpoint path (issue 24).
  small=(--model nano --micro-batch-size 4 --global-batch-size 16 --lr-decay-iters 8)
  echo x >file
  out=$(run -np 2 "$exe" "${small[@]}" --train-iters 3 --save file/ck 2>&1); rc=$?
  [ $rc -eq 3 ] || { echo "$out" | tail -3; fail "unwritable --save: exit $rc, expected 3"; }
  grep -q "\-\-save file/ck: cannot create the directory: .*(checked at start-up, before training)" <<<"$out" ||
    { echo "$out" | tail -3; fail "no start-up message for --save"; }
  ! grep -q "iteration  *1/" <<<"$out" || fail "trained before refusing --save"
  out=$(run -np 2 "$exe" "${small[@]}" --train-iters 3 --load file 2>&1); rc=$?
  [ $rc -eq 3 ] || { echo "$out" | tail -3; fail "--load of a regular file: exit $rc, expected 3"; }
  grep -q "\-\-load file: not a directory" <<<"$out" || { echo "$out" | tail -3; fail "no message for --load FILE"; }
  ok "unwritable --save and --load FILE refused at start-up (exit 3)"
  run -np 2 "$exe" "${small[@]}" --train-iters 4 --save ck >s.log 2>&1 || fail "saving run"
  out=$(run -np 2 "$exe" "${small[@]}" --train-iters 3 --load ck 2>&1) || { echo "$out" | tail -3; fail "resume past the end"; }
  grep -q "ck/iter_0000004 is already at iteration 4, past --train-iters 3: nothing to train" <<<"$out" ||
    { echo "$out" | tail -3; fail "no message for a checkpoint past --train-iters"; }
  ok "a checkpoint past --train-iters is said"
  # A full disk (here RLIMIT_FSIZE of the ranks: writes past 32 KiB fail with EFBIG) under the
  # save of iteration 2: the next save stops the run naming iteration 2, not the one it stopped at.
  # (TCP between the ranks: the shared-memory transport would need files past the limit.)
  printf '#!/bin/bash\ntrap "" XFSZ; ulimit -f 32; exec "$@"\n' >limited.sh
  out=$(OMPI_MCA_btl=self,tcp run -np 2 bash limited.sh "$exe" "${small[@]}" --train-iters 6 --save full --save-interval 2 2>&1); rc=$?
  [ $rc -eq 3 ] || { echo "$out" | tail -5; fail "disk full: exit $rc, expected 3"; }
  grep -q "the checkpoint of iteration 2 was not written (the failing rank says why); stopped at iteration 4" <<<"$out" ||
    { echo "$out" | tail -5; fail "the final message does not name iteration 2"; }
  ok "a failed background save is named by its iteration"
  ;;
init)
  # --init-from a HF safetensors file (written by --export-hf of a short run): the model shape
  # comes from the file, tp2 x pp2 x dp2 trains the losses of one rank, and the weights matter.
  mb=(--micro-batch-size 4 --global-batch-size 32 --train-iters 4 --lr-decay-iters 4)
  run -np 1 "$exe" --model nano --num-layers 4 "${mb[@]}" --train-iters 3 --seed 77 --export-hf init.safetensors >p.log 2>&1 ||
    { tail -5 p.log; fail "pretraining run"; }
  grep -q "exported the model to init.safetensors" p.log || fail "no export message"
  run -np 1 "$exe" "${mb[@]}" --init-from init.safetensors --metrics-jsonl one.jsonl >one.log 2>&1 || { tail -5 one.log; fail "np 1"; }
  grep -q "^num-layers = 4" one.log || fail "the layer count did not come from the file"
  run -np 8 "$exe" "${mb[@]}" --tp 2 --pp 2 --init-from init.safetensors --metrics-jsonl eight.jsonl \
    --export-hf out.safetensors >eight.log 2>&1 || { tail -5 eight.log; fail "np 8"; }
  same_losses one.jsonl eight.jsonl 1e-5
  run -np 1 "$exe" --model nano --num-layers 4 "${mb[@]}" --metrics-jsonl fresh.jsonl >fresh.log 2>&1 || fail "fresh run"
  [ "$(losses one.jsonl | head -n 1)" != "$(losses fresh.jsonl | head -n 1)" ] || fail "--init-from did not change the start"
  [ -s out.safetensors ] || fail "no exported file"
  ok "--init-from at tp2 x pp2 x dp2 = one rank; export written"
  # The same weights as an llm.c .bin (gpt_eval --save converts; it needs a token file to read).
  if [ -n "$gpt_eval" ]; then
    python3 -c "import struct,random; random.seed(3); t=[random.randrange(67) for _ in range(64)]
open('tok.bin','wb').write(struct.pack('<256i',20240520,1,len(t),*([0]*253))+struct.pack('<%dH'%len(t),*t))"
    run -np 1 "$gpt_eval" --weights init.safetensors --data tok.bin --batch 1 --seq 8 --batches 1 --save init.bin >g.log 2>&1 ||
      { tail -3 g.log; fail "gpt_eval --save init.bin"; }
    run -np 4 "$exe" "${mb[@]}" --tp 2 --pp 2 --init-from init.bin --metrics-jsonl llmc.jsonl >l.log 2>&1 ||
      { tail -5 l.log; fail "--init-from init.bin"; }
    same_losses one.jsonl llmc.jsonl 1e-5
    ok "--init-from the llm.c .bin of the same weights at tp2 x pp2 = one rank from the HF file"
  fi
  ;;
init_checked)
  # --init-from and --export-hf on a backend whose buffers the host cannot read (cpu-checked maps
  # them PROT_NONE outside its own calls, as a GPU's memory is to the host): the same losses and
  # the same exported bytes as the plain CPU backend, at tp 2 (sharded load, gathered save).
  mb=(--micro-batch-size 4 --global-batch-size 16 --train-iters 2 --lr-decay-iters 2)
  run -np 1 "$exe" --model nano --num-layers 2 "${mb[@]}" --seed 5 --export-hf init.safetensors >p.log 2>&1 ||
    { tail -5 p.log; fail "pretraining run"; }
  for b in cpu cpu-checked; do
    run -np 2 "$exe" "${mb[@]}" --tp 2 --backend $b --init-from init.safetensors --metrics-jsonl $b.jsonl \
      --export-hf $b.safetensors >$b.log 2>&1 || { tail -5 $b.log; fail "--backend $b --init-from --export-hf"; }
  done
  same_losses cpu.jsonl cpu-checked.jsonl 0
  cmp cpu.safetensors cpu-checked.safetensors || fail "the files exported by cpu and cpu-checked differ"
  cmp -s init.safetensors cpu.safetensors && fail "the export equals the initial weights: no step was taken"
  ok "--init-from and --export-hf on cpu-checked = cpu, bit for bit"
  ;;
export_hf)
  # The exported file gives HF (or the plain-torch GPT-2 of hf_check.py) gpt_eval's loss.
  [ -n "$gpt_eval" ] || fail "needs gpt_eval"
  "$hf_python" -c "import torch" 2>/dev/null || { echo "skip: no torch in $hf_python (Debian: python3-torch)"; exit 77; }
  run -np 4 "$exe" --model nano --num-layers 4 --micro-batch-size 4 --global-batch-size 32 --train-iters 3 --tp 2 --pp 2 \
    --export-hf model.safetensors >t.log 2>&1 || { tail -5 t.log; fail "training run"; }
  "$hf_python" "$scripts/hf_export_check.py" "$gpt_eval" model.safetensors --mpirun "$mpiexec" --np 2 || fail "HF disagrees"
  ok "exported file: HF loss = gpt_eval loss"
  ;;
zero)
  # Issue 27: a checkpoint saved at each ZeRO level at dp 4 (0, 1, 2, 3, and 3 with HSDP groups of
  # 2) is loaded at every level. The manifest and the resume message name both levels. The same
  # level continues the straight run bit for bit (losses and the saved state); another level within
  # 1e-5 (an all-reduce and a reduce-scatter sum in other orders).
  levels=("0" "1" "2" "3" "3 --zero-shard-size 2")
  for k in "${!levels[@]}"; do
    lv=(--zero ${levels[$k]})
    run -np 4 "$exe" "${base[@]}" "${lv[@]}" --save "straight_$k" --metrics-jsonl "a_$k.jsonl" >a.log 2>&1 ||
      { tail -5 a.log; fail "straight run at --zero ${levels[$k]}"; }
    run -np 4 "$exe" "${base[@]}" "${lv[@]}" --train-iters 4 --save "half_$k" >b.log 2>&1 ||
      { tail -5 b.log; fail "first half at --zero ${levels[$k]}"; }
    python3 -c "import json,sys; l=json.load(open('half_$k/iter_0000004/manifest.json'))['layout']
sys.exit(None if (l['zero'], l['zero1']) == (${lv[1]}, ${lv[1]} >= 1) else f'layout {l}')" ||
      fail "the manifest does not record --zero ${levels[$k]}"
  done
  for k in "${!levels[@]}"; do
    for j in "${!levels[@]}"; do
      lj=(--zero ${levels[$j]}); zk=${levels[$k]%% *}
      rm -f r.jsonl; rm -rf res
      run -np 4 "$exe" "${base[@]}" "${lj[@]}" --load "half_$k" --save res --metrics-jsonl r.jsonl >r.log 2>&1 ||
        { tail -5 r.log; fail "--zero ${levels[$k]} checkpoint resumed at --zero ${levels[$j]}"; }
      grep -q "resumed from half_$k/iter_0000004: iteration 4, 128 consumed samples (written at tp 1 pp 1 dp 4 zero $zk, loaded at tp 1 pp 1 dp 4 zero ${lj[1]}" r.log ||
        { grep resumed r.log; fail "no resume message naming the levels ($k -> $j)"; }
      tail -n 4 "a_$j.jsonl" >a_tail.jsonl
      if [ "$k" = "$j" ]; then
        same_losses a_tail.jsonl r.jsonl 0
        same_state "straight_$j/iter_0000008" res/iter_0000008
      else
        same_losses a_tail.jsonl r.jsonl 1e-5
      fi
      ok "saved at --zero ${levels[$k]}, resumed at --zero ${levels[$j]}"
    done
  done
  # A manifest written before ZeRO-2/3 has zero1 and no zero: read as level 1 (or 0).
  rm -rf old; cp -r half_1 old
  python3 "$forge" old/iter_0000004 "del m['layout']['zero']" || fail "forge"
  run -np 4 "$exe" "${base[@]}" --zero 3 --load old --metrics-jsonl r.jsonl >r.log 2>&1 || { tail -5 r.log; fail "old manifest"; }
  grep -q "written at tp 1 pp 1 dp 4 zero 1, loaded at tp 1 pp 1 dp 4 zero 3)" r.log || { grep resumed r.log; fail "old manifest's level"; }
  tail -n 4 a_3.jsonl >a_tail.jsonl
  same_losses a_tail.jsonl r.jsonl 1e-5
  ok "a manifest without layout.zero (zero1 only) loads as level 1"
  ;;
zero_layouts)
  # Issue 27: checkpoints of sharded runs load at other layouts and levels: tp2 x pp2 x dp2 with
  # ZeRO-3, dp 2 with ZeRO-2, dp 4 with ZeRO-3 (HSDP 2) and MoE at dp 4 x ep 2 with ZeRO-3, each
  # resumed at other tp / pp / dp (dp 2 <-> 4 <-> 8) / ep, schedules and levels: the straight
  # run's losses within 1e-5.
  moe="--moe-every 2 --experts 4 --topk 2 --no-drop"  # experts shard over expert-DP
  sources=("8 --tp 2 --pp 2 --zero 3" "2 --zero 2" "4 --zero 3 --zero-shard-size 2" "4 --ep 2 --zero 3 $moe")
  targets=("4 --zero 3|8 --tp 1 --pp 4 --zero 3|8 --tp 2 --pp 1 --zero 2|2 --zero 0|8 --zero 3 --zero-shard-size 4|4 --tp 1 --pp 2 --vpp 2 --schedule interleaved --zero 3"
           "4 --zero 3|8 --tp 2 --pp 2 --zero 3|4 --zero 3 --zero-shard-size 2|4 --tp 2 --zero 1"
           "2 --zero 3|8 --tp 2 --pp 2 --zero 2|8 --zero 3 --zero-shard-size 4|1 --zero 0"
           "4 --ep 1 --zero 0 $moe|4 --ep 4 --zero 2 $moe|2 --ep 2 --zero 3 $moe")
  for k in "${!sources[@]}"; do
    set -- ${sources[$k]}; np=$1; shift; src=("$@")
    rm -rf ck; rm -f a.jsonl
    run -np "$np" "$exe" "${base[@]}" "${src[@]}" --metrics-jsonl a.jsonl >a.log 2>&1 || { tail -5 a.log; fail "straight run (${sources[$k]})"; }
    tail -n 4 a.jsonl >a_tail.jsonl
    run -np "$np" "$exe" "${base[@]}" "${src[@]}" --train-iters 4 --save ck >b.log 2>&1 || { tail -5 b.log; fail "first half (${sources[$k]})"; }
    IFS='|' read -ra layouts <<<"${targets[$k]}"
    for layout in "${layouts[@]}"; do
      set -- $layout; np=$1; shift
      rm -f r.jsonl
      run -np "$np" "$exe" "${base[@]}" "$@" --load ck --metrics-jsonl r.jsonl >r.log 2>&1 ||
        { tail -5 r.log; fail "np ${sources[$k]} resumed at np $layout"; }
      grep -q "resumed from ck/iter_0000004: iteration 4" r.log || fail "no resume at $layout"
      same_losses a_tail.jsonl r.jsonl 1e-5
      ok "saved at np ${sources[$k]}, resumed at np $layout"
    done
  done
  ;;
export_zero)
  # Issue 27: --export-hf under ZeRO-2 with a compute copy (cpu-emulated bf16: the step gathers the
  # copy, the export gathers the masters) and under ZeRO-3 (no whole master on any rank: each is
  # assembled from the shard group), GPT-2 and Llama: every exported tensor is the zero-0 run's
  # within 1e-5 (the gradient reductions sum in other orders), ZeRO-2 = ZeRO-3 bit for bit at
  # the same layout; a run one iteration shorter differs by far more (the comparison can fail).
  cat >cmp.py <<'PY'
import array, json, os, struct, sys
def load(p):
    if os.path.isdir(p): p = os.path.join(p, "model.safetensors")
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]; out[k] = array.array("f", d[s:e])
    return out
a, b, tol, far = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3]), sys.argv[4:] == ["far"]
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
d = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)
print(f"{sys.argv[1]} vs {sys.argv[2]}: {len(a)} tensors, max difference {d:.3g}")
sys.exit(0 if (d > tol if far else d <= tol) else 1)
PY
  same_export() { python3 cmp.py "$1" "$2" "$3" || fail "exports differ: $1 vs $2 (tolerance $3)"; }
  ex() {  # ex OUT NP FLAGS...: train 3 iterations, export to OUT
    local out=$1 np=$2; shift 2
    run -np "$np" "$exe" "${base[@]}" --train-iters 3 "$@" --export-hf "$out" >"$out.log" 2>&1 ||
      { tail -5 "$out.log"; fail "export run $out"; }
    grep -q "exported the model to $out" "$out.log" || fail "no export message ($out)"
  }
  ex z0.safetensors 4 --zero 0
  ex z0_short.safetensors 4 --zero 0 --train-iters 2
  python3 cmp.py z0.safetensors z0_short.safetensors 1e-4 far || fail "one iteration more changed no weight by 1e-4"
  ex z3.safetensors 4 --zero 3
  ex z3_3d.safetensors 8 --tp 2 --pp 2 --zero 3
  ex z3_hsdp.safetensors 8 --zero 3 --zero-shard-size 4
  for f in z3 z3_3d z3_hsdp; do same_export z0.safetensors $f.safetensors 1e-5; done
  ok "GPT-2 export under ZeRO-3 (dp 4, tp2 x pp2 x dp2, HSDP 4 of dp 8) = ZeRO-0's"
  bf=(--backend cpu-emulated --bf16)
  for z in 0 2 3; do ex "b$z.safetensors" 4 "${bf[@]}" --zero $z; done
  same_export b0.safetensors b2.safetensors 1e-5
  cmp b2.safetensors b3.safetensors || fail "ZeRO-2 and ZeRO-3 exports (bf16 compute copy) differ"
  ok "bf16 compute copy: ZeRO-2 export = ZeRO-3 export bit for bit, = ZeRO-0's within 1e-5"
  base=(--model llama-nano --num-layers 4 --micro-batch-size 4 --global-batch-size 32 --lr-decay-iters 8)
  ex l0 4 --zero 0
  ex l3 8 --tp 2 --zero 3
  ex l2 4 --zero 2
  cmp l0/config.json l3/config.json || fail "Llama config.json differs"
  same_export l0 l3 1e-5
  same_export l0 l2 1e-5
  ok "Llama directory export under ZeRO-3 at tp 2 x dp 4 and ZeRO-2 = ZeRO-0's"
  ;;
minutes)
  # --save-interval-minutes: saves when that much wall time passed since the last save, by rank 0's
  # clock for every rank; with --save-interval 0 nothing else saves before the end. Iterations are
  # slowed to >= 150 ms (TRIAX_FAULT slow on rank 1: every rank waits for it), the interval is 0.4 s.
  small=(--model nano --micro-batch-size 4 --global-batch-size 16 --lr-decay-iters 12 --keep-last 0)
  TRIAX_FAULT=1:1:slow:150 run -np 2 -x TRIAX_FAULT "$exe" "${small[@]}" --train-iters 12 --save ck \
    --save-interval-minutes 0.00667 >m.log 2>&1 || { tail -5 m.log; fail "saving run"; }
  n=$(ls -d ck/iter_* | wc -l)
  # 12 iterations of >= 150 ms: a save every >= 0.4 s is every 3rd iteration or so, and the last.
  [ "$n" -ge 3 ] && [ "$n" -le 9 ] || fail "expected 3..9 checkpoints by time, got $n: $(ls ck | tr '\n' ' ')"
  [ -d ck/iter_0000012 ] || fail "no checkpoint at the end"
  # The same run without the time rule saves once (at the end).
  TRIAX_FAULT=1:1:slow:150 run -np 2 -x TRIAX_FAULT "$exe" "${small[@]}" --train-iters 12 --save ck0 >m0.log 2>&1 \
    || fail "run without minutes"
  [ "$(ls ck0 | tr '\n' ' ')" = "iter_0000012 " ] || fail "without --save-interval-minutes: $(ls ck0 | tr '\n' ' ')"
  ok "--save-interval-minutes 0.00667 saved $n checkpoints in 12 slowed iterations (1 without it)"
  ;;
*) fail "unknown case $case_" ;;
esac
