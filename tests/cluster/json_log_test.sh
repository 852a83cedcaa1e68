#!/usr/bin/env bash
# TRIAX_LOG_FORMAT=json on a real train_gpt run (np 2, metrics endpoint on): every line it writes
# to stdout and stderr is one JSON object with time, rank, host, level, message, fields; the
# iteration records carry the same values as the JSONL file. A failing run reports in JSON too.
#   json_log_test.sh TRAIN_GPT MPIEXEC
set -uo pipefail
exe=$1; mpiexec=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export TRIAX_LOG_FORMAT=json
timeout 300 "$mpiexec" --oversubscribe -np 2 "$exe" --dp 2 --train-iters 4 --metrics-port 0 --metrics-bind 127.0.0.1 \
  --metrics-jsonl "$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" || { tail -20 "$tmp/out" "$tmp/err"; fail "train_gpt failed"; }
timeout 120 "$mpiexec" --oversubscribe -np 2 "$exe" --dp 3 --train-iters 1 >"$tmp/out2" 2>"$tmp/err2" && fail "--dp 3 on 2 ranks succeeded"
python3 - "$tmp" <<'PY' || fail "json log check"
import json, sys, socket
d = sys.argv[1]
def records(name):
    rows = []
    for n, line in enumerate(open(f"{d}/{name}"), 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{name}:{n}: not JSON ({e}): {line!r}")
        assert isinstance(r, dict), (name, n, line)
        assert list(r) == ["time", "rank", "host", "level", "message", "fields"], (name, n, list(r))
        assert r["level"] in ("error", "warn", "info", "debug"), r
        assert r["time"].endswith("Z") and r["time"][10] == "T", r["time"]
        assert r["host"] == socket.gethostname(), r["host"]
        rows.append(r)
    return rows
out, err = records("out"), records("err")
its = [r for r in out if "iteration" in r["fields"]]
assert len(its) == 4, len(its)
ref = [json.loads(l) for l in open(f"{d}/m.jsonl")]
assert [r["fields"] for r in its] == ref, "iteration fields differ from the JSONL"
assert all("lm loss:" in r["message"] for r in its)
cfg = [r for r in out if r["message"] == "resolved configuration"]
assert len(cfg) == 1 and "dp = 2" in cfg[0]["fields"]["config"], cfg
assert any("metrics: serving" in r["message"] for r in err), [r["message"] for r in err]
# mpirun's own MPI_Abort banner is not ours and stays text; every line triax wrote is JSON.
bad = [json.loads(l) for l in open(f"{d}/err2") if l.startswith("{")]
assert any(r["level"] == "error" and "configuration error" in r["message"] for r in bad), bad
print(f"ok: {len(out)} stdout and {len(err)} stderr lines of the run, {len(bad)} of the failing run, all JSON")
PY
