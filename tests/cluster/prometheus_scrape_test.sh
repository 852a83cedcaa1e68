#!/usr/bin/env bash
# Debian's Prometheus scrapes a real train_gpt run (np 2, rank 0 aggregates) on loopback; its
# HTTP API must return the values the log line and the JSONL printed for the last iteration, the
# per-rank series for both ranks, and the textfile must pass `promtool check metrics`.
#   prometheus_scrape_test.sh TRAIN_GPT MPIEXEC
set -uo pipefail
exe=$1; mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v prometheus >/dev/null && command -v promtool >/dev/null || { echo "SKIP: prometheus not installed"; exit 77; }
tmp=$(mktemp -d)
prom_pid=
cleanup() { [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/prom.log" ] && tail -5 "$tmp/prom.log"; exit 1; }

read -r mport pport < <(python3 "$here/free_ports.py" 2)
cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: triax
    static_configs:
      - targets: ['127.0.0.1:$mport']
YML
timeout 120 prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn >"$tmp/prom.log" 2>&1 &
prom_pid=$!
for _ in $(seq 100); do
  python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$pport/-/ready', timeout=1)" 2>/dev/null && break
  kill -0 "$prom_pid" 2>/dev/null || fail "prometheus exited"
  sleep 0.2
done

# The scrape manager applies new targets on a 5 s tick: wait until ours is listed (it reads
# "down" until train_gpt listens), so the short run is scraped from its first iterations.
listed=
for _ in $(seq 100); do
  python3 -c "import json,urllib.request,sys; t=json.load(urllib.request.urlopen('http://127.0.0.1:$pport/api/v1/targets', timeout=1)); sys.exit(0 if t['data']['activeTargets'] else 1)" 2>/dev/null && { listed=1; break; }
  sleep 0.2
done
[ -n "$listed" ] || fail "prometheus never listed the scrape target"
start=$(date +%s.%N)
timeout 300 "$mpiexec" --oversubscribe -np 2 "$exe" --dp 2 --train-iters 6 --metrics-port "$mport" --metrics-bind 127.0.0.1 \
  --metrics-linger 4 --metrics-jsonl "$tmp/m.jsonl" --metrics-textfile "$tmp/triax.prom" >"$tmp/out" 2>&1 \
  || { tail -20 "$tmp/out"; fail "train_gpt failed"; }
end=$(date +%s.%N)
promtool check metrics <"$tmp/triax.prom" || fail "promtool check metrics rejects the textfile"

python3 - "$tmp/out" "$tmp/m.jsonl" "$tmp/triax.prom" "$pport" "$start" "$end" <<'PY' || fail "values differ"
import json, re, sys, urllib.parse, urllib.request
out, jsonl, textfile, port, t0, t1 = sys.argv[1:7]
t0, t1 = float(t0), float(t1)
lines = [l for l in open(out) if "lm loss:" in l]
last_log = lines[-1]
def logged(name, cast=float):
    m = re.search(re.escape(name) + r":\s*([-+0-9.eE]+)", last_log)
    assert m, (name, last_log)
    return cast(m.group(1))
it = re.search(r"iteration\s+(\d+)/", last_log)
row = [json.loads(l) for l in open(jsonl)][-1]

def query(q):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    r = json.load(urllib.request.urlopen(url, timeout=5))
    assert r["status"] == "success", r
    return r["data"]["result"]
def scalar(metric, fn="last_over_time"):
    res = query(f'{fn}({metric}{{job="triax"}}[5m])')
    assert len(res) == 1, (metric, res)
    return float(res[0]["value"][1])
def close(a, b, rel=0.0, abs_=0.0):
    return abs(a - b) <= max(abs_, rel * abs(b))

checks = []
def check(name, got, want, **tol):
    ok = close(got, want, **tol)
    checks.append(ok)
    print(f"{'ok ' if ok else 'BAD'} {name}: prometheus {got!r} expected {want!r}")

check("iteration vs log", scalar("triax_iteration"), float(it.group(1)))
check("consumed samples vs log", scalar("triax_consumed_samples_total"), logged("consumed samples"))
check("loss vs log (printed to 7 digits)", scalar("triax_loss"), logged("lm loss"), rel=6e-7)
check("loss vs jsonl (exact)", scalar("triax_loss"), row["loss"])
check("grad norm vs log (3 decimals)", scalar("triax_grad_norm"), logged("grad norm"), abs_=5e-4)
check("grad norm vs jsonl", scalar("triax_grad_norm"), row["grad_norm"])
check("learning rate vs log", scalar("triax_learning_rate"), logged("learning rate"), rel=6e-7)
check("tokens/s vs log (integer)", scalar("triax_tokens_per_second"), logged("throughput (tokens/s)"), abs_=0.5)
check("tokens/s vs jsonl", scalar("triax_tokens_per_second"), row["tokens_per_s"])
check("step time vs log", scalar("triax_step_seconds") * 1e3, logged("elapsed time per iteration (ms)"), abs_=0.05)
check("step time vs jsonl", scalar("triax_step_seconds") * 1e3, row["elapsed_ms"], rel=1e-12)
check("TFLOP/s vs jsonl", scalar("triax_tflops_per_rank"), row["tflops"])
check("skipped vs log", scalar("triax_skipped_iterations_total"), logged("number of skipped iterations"))
check("dp exposed vs jsonl", scalar("triax_dp_exposed_seconds") * 1e3, row["dp_exposed_ms"], rel=1e-12)
check("pipeline wait vs jsonl", scalar("triax_pipeline_wait_seconds") * 1e3, row["p2p_wait_ms"], rel=1e-12)
ranks = query('last_over_time(triax_rank_compute_seconds{job="triax"}[5m])')
check("per-rank compute series", len(ranks), 2)
check("max per-rank compute vs jsonl compute (max over ranks)", max(float(r["value"][1]) for r in ranks) * 1e3,
      row["compute_ms"], rel=1e-12)
check("ranks labelled 0 and 1", sorted(int(r["metric"]["rank"]) for r in ranks) == [0, 1], True)
prog = scalar("triax_last_progress_timestamp_seconds")
check("last progress inside the run", t0 <= prog <= t1, True)
# Several scrapes during the run, not just one.
check("scraped more than once", scalar("triax_iteration", "count_over_time") >= 2, True)
info = query('triax_parallel_info{job="triax"} or last_over_time(triax_parallel_info{job="triax"}[5m])')
check("layout info dp=2 world=2", info[0]["metric"]["dp"] == "2" and info[0]["metric"]["world"] == "2", True)
# The textfile holds the same last iteration.
text = dict(l.rsplit(" ", 1) for l in open(textfile) if l.strip() and not l.startswith("#"))
check("textfile loss vs jsonl", float(text["triax_loss"]), row["loss"])
check("textfile iteration", float(text["triax_iteration"]), row["iteration"])
sys.exit(0 if all(checks) else 1)
PY
echo "ok: prometheus scraped the run and returned the logged values"
