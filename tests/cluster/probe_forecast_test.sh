#!/usr/bin/env bash
# triax-probe --forecast: the fixture of probe_test.sh re-scored with a triax-forecast predict --json
# file in which node-b (the best score) is predicted 90% busy. The hostfile must follow
# placement = score x (1 - predicted) (recomputed here from the JSON), the straggler node-c stays
# last, the JSON and Prometheus text carry predicted and placement, and a forecast that lacks a
# probed host or holds a bad value is refused (exit 2) with the file and the hosts named.
#   probe_forecast_test.sh TRIAX_PROBE SOURCE_DIR
set -uo pipefail
exe=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
fixture=$src/tests/cluster/probe_fixture.json
forecast=$src/tests/cluster/probe_forecast_fixture.json
"$exe" --score-from "$fixture" --hostfile "$tmp/plain" >/dev/null || fail "--score-from without a forecast"
"$exe" --score-from "$fixture" --forecast "$forecast" --json "$tmp/f.json" --prometheus "$tmp/f.prom" \
  --hostfile "$tmp/hosts" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "--forecast failed"; }
cat "$tmp/out" "$tmp/hosts"
grep -q "place" "$tmp/out" || fail "the table has no placement column"
grep -q "node-e" "$tmp/out" || fail "the forecast-only host node-e was not reported as ignored"
grep -q "^triax_probe_placement{host=\"node-b\",rank=\"1\"}" "$tmp/f.prom" || fail "no placement gauge"
if command -v promtool >/dev/null; then promtool check metrics <"$tmp/f.prom" || fail "promtool check metrics"; fi
/usr/bin/env python3 - "$tmp" "$forecast" <<'PY' || fail "placement checks"
import json, sys
tmp, forecast = sys.argv[1:3]
pred = {n["node"]: n["predicted_utilisation"] for n in json.load(open(forecast))["nodes"]}
doc = json.load(open(f"{tmp}/f.json"))
def hosts_in(path):
    return [l.split()[0 if not l.startswith("# ") else 1] for l in open(path) if " slots=" in l]
for n in doc["nodes"]:
    assert n["predicted_utilisation"] == pred[n["host"]], n
    assert abs(n["placement"] - n["score"] * (1 - pred[n["host"]])) <= 1e-12, n
want = [n["host"] for n in sorted(doc["nodes"], key=lambda n: (n["straggler"], -n["placement"]))]
got = hosts_in(f"{tmp}/hosts")
assert got == want, (got, want)
plain = hosts_in(f"{tmp}/plain")
assert plain[0] == "node-b" and got.index("node-b") > got.index("node-a"), (plain, got)
assert got[-1] == "node-c", got
PY
sed "/node-c\\|node-d/d" "$forecast" >"$tmp/part.json"
out=$("$exe" --score-from "$fixture" --forecast "$tmp/part.json" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "part.json: the forecast has no prediction for probed host(s) node-c, node-d: re-run triax-forecast predict" <<<"$out" \
  || fail "a forecast without node-c and node-d: rc $rc: $out"
sed 's/"predicted_utilisation": 0.9,/"predicted_utilisation": 1.2,/' "$forecast" >"$tmp/range.json"
out=$("$exe" --score-from "$fixture" --forecast "$tmp/range.json" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "range.json: forecast node node-b: predicted_utilisation = 1.2 is not in \[0, 1\]" <<<"$out" \
  || fail "a prediction of 1.2: rc $rc: $out"
out=$("$exe" --score-from "$fixture" --forecast "$tmp/none.json" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "none.json: cannot open" <<<"$out" || fail "a missing forecast: rc $rc: $out"
echo "ok: triax-probe --forecast orders by placement and refuses incomplete forecasts"
