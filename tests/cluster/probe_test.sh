#!/usr/bin/env bash
# triax-probe end to end: three ranks posing as three hosts (TRIAX_HOSTNAME) measure and score;
# the scores are recomputed from the measurements, the hostfile follows them, the Prometheus text
# passes promtool, and the recording rules in clusters/prometheus/triax_probe_rules.yml give the
# same scores as the C++ side on these measured values (promtool test rules on generated input).
# Then --score-from a fixture with a slow node: flagged, last in the hostfile, alert fires.
#   probe_test.sh TRIAX_PROBE MPIEXEC SOURCE_DIR
set -uo pipefail
exe=$1; mpiexec=$2; src=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
small=(--gemm-n 256 --reps 2 --triad-mib 8 --io-mib 4 --io-seconds 0.3 --latency-iters 50)
mpmd=()
for h in node-a node-b node-c; do
  [ ${#mpmd[@]} -gt 0 ] && mpmd+=(:)
  mpmd+=(-np 1 -x TRIAX_HOSTNAME=$h "$exe" "${small[@]}" --io-dir "$tmp" --json "$tmp/p.json" --prometheus "$tmp/p.prom" --hostfile "$tmp/hosts")
done
timeout 200 "$mpiexec" --oversubscribe "${mpmd[@]}" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "triax-probe failed"; }
cat "$tmp/out"
ls "$tmp"/.triax-probe-* 2>/dev/null && fail "the IOPS files were left behind"
"$exe" --score-from "$src/tests/cluster/probe_fixture.json" --json "$tmp/f.json" --prometheus "$tmp/f.prom" \
  --hostfile "$tmp/fhosts" --exclude-stragglers >"$tmp/fout" 2>&1 || { cat "$tmp/fout"; fail "--score-from failed"; }
"$exe" --score-from "$src/tests/cluster/probe_fixture.json" --weights 1,0,0,0 --json "$tmp/w.json" >/dev/null || fail "--weights"
out=$("$exe" --score-from "$src/tests/cluster/probe_fixture.json" --weights -1,0,0,0 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "weights must be finite and >= 0" <<<"$out" || fail "negative weight not refused clearly: rc $rc: $out"
out=$("$exe" --score-from "$tmp/none.json" 2>&1) && fail "a missing --score-from file was accepted"
grep -q "none.json: cannot open" <<<"$out" || fail "missing file not named: $out"
out=$("$exe" "${small[@]}" --io-dir "$tmp/no/such/dir" 2>&1) && fail "a missing --io-dir was accepted"
grep -q "no/such/dir" <<<"$out" || fail "missing io dir not named: $out"

# RDMA discovery on the RoCE fixture tree, and on this machine (no HCA: none found, sockets).
out=$("$exe" --rdma --sysfs-root "$src/tests/cluster/fixtures/sysfs-roce") || fail "--rdma on the fixture"
grep -q "export NCCL_IB_HCA=mlx5_0:1" <<<"$out" && grep -q "export NCCL_IB_GID_INDEX=3" <<<"$out" \
  && grep -q "export NCCL_SOCKET_IFNAME=eth2" <<<"$out" || fail "--rdma fixture settings: $out"
out=$("$exe" --rdma) || fail "--rdma on this machine"
echo "$out"
[ -d /sys/class/infiniband ] || grep -q "NCCL_IB_DISABLE=1" <<<"$out" || fail "no HCA here but IB not disabled: $out"
if command -v promtool >/dev/null; then
  for f in p f; do promtool check metrics <"$tmp/$f.prom" || fail "promtool check metrics $f.prom"; done
fi
python3 - "$tmp" "$src/clusters/prometheus/triax_probe_rules.yml" <<'PY' || fail "score checks"
import json, statistics, sys
tmp, rules = sys.argv[1:3]
def rescore(nodes, w=(0.4, 0.3, 0.2, 0.1)):
    med = {k: statistics.median(n[k] for n in nodes) for k in ("gemm_flops", "triad_bytes_per_second", "latency_seconds", "read_iops")}
    out = []
    for n in nodes:
        t = (n["gemm_flops"] / med["gemm_flops"], n["triad_bytes_per_second"] / med["triad_bytes_per_second"],
             med["latency_seconds"] / n["latency_seconds"], n["read_iops"] / med["read_iops"])
        out.append(sum(a * b for a, b in zip(w, t)) / sum(w))
    return out
def hosts_in(path):
    return [l.split()[0 if not l.startswith("# ") else 1] for l in open(path) if " slots=" in l]
p, f, w = (json.load(open(f"{tmp}/{x}.json")) for x in ("p", "f", "w"))
assert [n["host"] for n in p["nodes"]] == ["node-a", "node-b", "node-c"], p["nodes"]
for doc, weights in ((p, (0.4, 0.3, 0.2, 0.1)), (f, (0.4, 0.3, 0.2, 0.1)), (w, (1, 0, 0, 0))):
    want = rescore(doc["nodes"], weights)
    got = [n["score"] for n in doc["nodes"]]
    assert all(abs(a - b) <= 1e-12 * abs(b) for a, b in zip(got, want)), (got, want)
    assert [n["straggler"] for n in doc["nodes"]] == [s < 0.8 for s in want]
order = sorted(p["nodes"], key=lambda n: (n["straggler"], -n["score"]))
assert hosts_in(f"{tmp}/hosts") == [n["host"] for n in order], (hosts_in(f"{tmp}/hosts"), order)
assert [n["host"] for n in f["nodes"] if n["straggler"]] == ["node-c"], f["nodes"]
fh = open(f"{tmp}/fhosts").read()
assert "\n# node-c slots=8" in fh and hosts_in(f"{tmp}/fhosts")[-1] == "node-c", fh
assert [n["score"] for n in w["nodes"]][1] == 120 / 105

# promtool: the recording rules on the probe's own output must give the C++ scores.
def series(prom, job):
    out = []
    for line in open(prom):
        if line.startswith("#") or not line.strip():
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, labels = name_labels.split("{", 1)
        out.append((f'{name}{{job="{job}",{labels}', value.strip()))
    return out
tests = []
for name, doc in (("p", p), ("f", f)):
    inp = "\n".join(f"      - series: '{s}'\n        values: '{v}x5'" for s, v in series(f"{tmp}/{name}.prom", "node"))
    # promtool compares exactly; the two sides round differently in the last bit, so the test
    # asks Prometheus whether its score and the probe's exported one agree to 1e-12.
    exp = "\n".join(f"          - labels: '{{job=\"node\",host=\"{n['host']}\",rank=\"{n['rank']}\"}}'\n"
                    f"            value: 1" for n in doc["nodes"])
    alerts = "\n".join(
        f"          - exp_labels: {{severity: warning, job: node, host: {n['host']}, rank: \"{n['rank']}\"}}\n"
        f"            exp_annotations:\n              summary: \"{n['host']} scores {n['score']:.3f} against the job's median node (threshold 0.8)\""
        for n in doc["nodes"] if n["straggler"]) or "          []"
    tests.append(f"""  - interval: 1m
    input_series:
{inp}
    promql_expr_test:
      - expr: abs(host:triax_probe_score:weighted - triax_probe_score) < bool 1e-12 * triax_probe_score
        eval_time: 2m
        exp_samples:
{exp}
    alert_rule_test:
      - eval_time: 2m
        alertname: NodeResourceStraggler
        exp_alerts:
{alerts}
""")
open(f"{tmp}/probe_rules_test.yml", "w").write(f"rule_files:\n  - {rules}\nevaluation_interval: 1m\ntests:\n" + "".join(tests))
PY
if command -v promtool >/dev/null; then
  promtool test rules "$tmp/probe_rules_test.yml" || { cat "$tmp/probe_rules_test.yml"; fail "recording rules disagree with triax-probe"; }
else
  echo "promtool not installed: recording-rule comparison skipped"
fi
echo "ok: triax-probe measured, scored, and the recording rules agree"
