#!/usr/bin/env bash
# triax-plan --plot FILE: the SVG parses as XML; one <g class="layout"> per layout of the search
# (as many as --json's "search" lists, in its order), each with rects whose seconds add up to the
# layout's predicted time; one layout's estimate gives one group; --plot with --tune is refused and
# an unwritable FILE is an error naming it.
#   plot_plan_test.sh TRIAX_PLAN
set -uo pipefail
plan=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

check() {  # check SVG JSON: the groups against the JSON's layouts
  python3 - "$1" "$2" <<'PY'
import json, sys, xml.etree.ElementTree as ET
svg, js = sys.argv[1], json.load(open(sys.argv[2]))
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(svg).getroot()
assert root.tag == ns + "svg", root.tag
groups = [g for g in root.iter(ns + "g") if g.get("class") == "layout"]
want = js["search"]["best"] if "search" in js else [js]
assert len(groups) == len(want), f"{len(groups)} layout groups, {len(want)} layouts"
terms = ("compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer", "core_sharing")
for g, e in zip(groups, want):
    rects = [r for r in g.iter(ns + "rect")]
    assert rects, "a layout group without bars"
    assert all(r.get("class") in terms for r in rects), [r.get("class") for r in rects]
    total = sum(float(r.get("data-seconds")) for r in rects)
    assert abs(total - e["seconds_per_iteration"]) <= 1e-4 * e["seconds_per_iteration"], (total, e["seconds_per_iteration"])
    for r in rects:
        assert abs(float(r.get("data-seconds")) - e["time"][r.get("class")]) <= 1e-4 * total + 1e-9, r.attrib
        assert float(r.get("width")) >= 0
    assert float(g.get("data-seconds")) > 0
print(f"ok: {len(groups)} layout groups matching the JSON")
PY
}

args=(--model megatron-39b --gpus 64 --top-k 4)
"$plan" "${args[@]}" --plot "$tmp/search.svg" >/dev/null || fail "search with --plot failed"
"$plan" "${args[@]}" --json >"$tmp/search.json" || fail "search --json failed"
check "$tmp/search.svg" "$tmp/search.json" || fail "search plot"
one=(--model gpt3-175b --tp 8 --pp 8 --dp 16 --mbs 1 --vpp 3 --recompute selective --sequence-parallel)
"$plan" "${one[@]}" --plot "$tmp/one.svg" --json >"$tmp/one.json" || fail "one layout with --plot failed"
check "$tmp/one.svg" "$tmp/one.json" || fail "one-layout plot"
out=$("$plan" --tune --model megatron-7.5b --gpus 128 --grad-accum 4 --mbs 64 --plot "$tmp/t.svg" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "does not go with --list, --tune" <<<"$out" || { echo "$out"; fail "--plot with --tune: exit $rc"; }
out=$("$plan" "${args[@]}" --plot "$tmp/missing/dir/p.svg" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -qF -- "--plot $tmp/missing/dir/p.svg: cannot open for writing" <<<"$out" || { echo "$out"; fail "unwritable --plot: exit $rc"; }
echo "PASS"
