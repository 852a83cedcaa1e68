#!/usr/bin/env bash
# The checkpoint-age metrics of a real train_gpt run (np 2): the exported last-checkpoint time is
# rank 0's commit of the newest checkpoint (its manifest's time), the interval is --save-interval
# times the mean iteration time of the JSONL, and a resumed run exports the loaded checkpoint's
# time before it saves anything. These feed the TrainingCheckpointTooOld alert.
#   checkpoint_metrics_test.sh TRAIN_GPT MPIEXEC
set -uo pipefail
exe=$1; mpiexec=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 300 "$mpiexec" --oversubscribe -np 2 "$exe" --model nano --tp 2 --micro-batch-size 4 \
  --global-batch-size 16 --lr-decay-iters 8 "$@"; }

start=$(date +%s.%N)
run --train-iters 4 --save "$tmp/ck" --save-interval 2 --metrics-jsonl "$tmp/a.jsonl" \
  --metrics-textfile "$tmp/a.prom" >"$tmp/a.out" 2>&1 || { tail -20 "$tmp/a.out"; fail "training with --save failed"; }
end=$(date +%s.%N)
[ -f "$tmp/ck/iter_0000004/manifest.json" ] || { ls -R "$tmp/ck"; fail "no checkpoint of iteration 4"; }
# A resumed run without --save: what it exports comes from the checkpoint it loaded.
run --train-iters 5 --load "$tmp/ck" --metrics-textfile "$tmp/b.prom" >"$tmp/b.out" 2>&1 \
  || { tail -20 "$tmp/b.out"; fail "the resumed run failed"; }
if command -v promtool >/dev/null; then
  promtool check metrics <"$tmp/a.prom" || fail "promtool check metrics rejects the textfile"
fi

python3 - "$tmp" "$start" "$end" <<'PY' || fail "checkpoint metrics wrong"
import json, os, sys
tmp, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def metrics(path):
    return {k: float(v) for k, v in (l.rsplit(" ", 1) for l in open(path) if l.strip() and not l.startswith("#"))}
a, b = metrics(f"{tmp}/a.prom"), metrics(f"{tmp}/b.prom")
manifest_t = os.path.getmtime(f"{tmp}/ck/iter_0000004/manifest.json")
rows = [json.loads(l) for l in open(f"{tmp}/a.jsonl")]
mean_s = sum(r["elapsed_ms"] for r in rows) / len(rows) / 1e3
ok = True
def check(name, cond, detail):
    global ok
    ok &= cond
    print(f"{'ok ' if cond else 'BAD'} {name}: {detail}")
last = a.get("triax_checkpoint_last_timestamp_seconds", 0.0)
check("last checkpoint inside the run", t0 <= last <= t1, f"{last} in [{t0}, {t1}]")
check("last checkpoint = the final commit (manifest time)", abs(last - manifest_t) < 1.0, f"{last} vs {manifest_t}")
iv = a.get("triax_checkpoint_interval_seconds", 0.0)
check("interval = 2 x mean iteration time", abs(iv - 2 * mean_s) <= 1e-9 * max(1.0, iv), f"{iv} vs {2 * mean_s}")
lb = b.get("triax_checkpoint_last_timestamp_seconds", 0.0)
check("resumed run exports the loaded checkpoint's time", abs(lb - manifest_t) < 1e-3, f"{lb} vs {manifest_t}")
check("no interval without --save", "triax_checkpoint_interval_seconds" not in b, str(sorted(k for k in b if "checkpoint" in k)))
sys.exit(0 if ok else 1)
PY
echo "ok: checkpoint age metrics follow the commits"
