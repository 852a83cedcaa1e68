#!/usr/bin/env bash
# scripts/plot_run.py on a real run: train_gpt (tiny model, pp 2, validation every 10 iterations)
# writes --metrics-jsonl; plot_run.py draws it to a PNG (checked: PNG signature, IHDR dimensions,
# size, many distinct colours; not the pixels) and, with --compare, to an SVG (parsed as XML).
# Bad input files fail with exit 1 and a message naming the file (and line); without matplotlib
# the script exits 77. Skipped (77) where PYTHON has no matplotlib (Debian: python3-matplotlib).
#   plot_run_test.sh PLOT_RUN_PY TRAIN_GPT MPIEXEC PYTHON
set -uo pipefail
script=$1; exe=$2; mpiexec=$3; py=$4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$py" -c "import matplotlib" 2>/dev/null || { echo "skipped: $py has no matplotlib (apt-get install python3-matplotlib)"; exit 77; }

# llm.c shards (256 int32 header: magic, version, token count; then uint16 tokens) of a learnable text.
"$py" - "$tmp" <<'PY' || fail "writing the data"
import struct, sys
text = b"".join(b"the cat sat on the mat %d. " % (i % 7) for i in range(400))
for name, body in (("train", text), ("val", text[:2000])):
    with open(f"{sys.argv[1]}/{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(body), *([0] * 253)))
        f.write(struct.pack(f"<{len(body)}H", *body))
PY
timeout 240 "$mpiexec" --oversubscribe -np 2 "$exe" --model nano --vocab-size 256 --num-layers 2 --seq-length 16 \
  --micro-batch-size 2 --num-micro-batches 2 --pp 2 --train-iters 30 --lr 1e-2 --eval-interval 10 --eval-iters 2 \
  --data "$tmp/train.bin" --valid-data "$tmp/val.bin" --metrics-jsonl "$tmp/m.jsonl" >"$tmp/out" 2>&1 ||
  { tail -20 "$tmp/out"; fail "train_gpt failed"; }
n_it=$(grep -c '"loss"' "$tmp/m.jsonl"); n_val=$(grep -c '"valid_loss"' "$tmp/m.jsonl")
[ "$n_it" -eq 30 ] && [ "$n_val" -ge 2 ] || fail "the run wrote $n_it iteration and $n_val validation records (30, >= 2 expected)"

"$py" "$script" "$tmp/m.jsonl" -o "$tmp/m.png" >"$tmp/plot.out" 2>&1 || { cat "$tmp/plot.out"; fail "plot_run.py failed"; }
grep -q "wrote $tmp/m.png (30 iterations, $n_val validation passes)" "$tmp/plot.out" || { cat "$tmp/plot.out"; fail "no 'wrote' line"; }
"$py" - "$tmp/m.png" <<'PY' || fail "the PNG"
import struct, sys
import matplotlib.image as mpimg
path = sys.argv[1]
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "no PNG signature"
length, kind = struct.unpack(">I4s", data[8:16])
assert kind == b"IHDR" and length == 13, (length, kind)
w, h = struct.unpack(">II", data[16:24])
assert w >= 600 and h >= 400, f"{w} x {h} pixels, expected at least 600 x 400"
assert data[-12:-4] == b"\x00\x00\x00\x00IEND", "no IEND chunk at the end (truncated?)"
assert len(data) > 20000, f"{len(data)} bytes: too small for six panels of curves"
img = mpimg.imread(path)
assert img.shape[:2] == (h, w), (img.shape, w, h)
pixels = [tuple(p[:3]) for p in (img.reshape(-1, img.shape[2]) * 255).round().astype(int).tolist()]
colours = set(pixels)
# Axes and text are black and grey; the curves are coloured: count what is clearly not grey.
tinted = [p for p in pixels if max(p) - min(p) > 40]
assert len(colours) > 50, f"only {len(colours)} distinct colours: a blank or near-blank image"
assert len(set(tinted)) > 20 and len(tinted) > 2000, f"{len(tinted)} coloured pixels ({len(set(tinted))} colours): no curves drawn?"
print(f"ok: {w} x {h} PNG, {len(data)} bytes, {len(colours)} distinct colours, {len(tinted)} coloured pixels")
PY

# Two runs compared, as SVG: parses as XML and has lines drawn (matplotlib paths).
"$py" "$script" "$tmp/m.jsonl" --compare "$tmp/m.jsonl" -o "$tmp/c.svg" >/dev/null 2>&1 || fail "--compare to SVG failed"
"$py" - "$tmp/c.svg" <<'PY' || fail "the SVG"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
paths = sum(1 for _ in root.iter("{http://www.w3.org/2000/svg}path"))
assert paths > 100, f"only {paths} paths"
print(f"ok: SVG with {paths} paths")
PY

# Clear errors: exit 1 naming the file and, for a bad line, its number; a bad extension is usage (2).
expect() {  # expect RC PATTERN ARGS...
  local rc=$1 pattern=$2 out got; shift 2
  out=$("$py" "$script" "$@" 2>&1); got=$?
  [ $got -eq "$rc" ] || { echo "$out"; fail "exit $got, expected $rc, for: $*"; }
  grep -qF -- "$pattern" <<<"$out" || { echo "$out"; fail "no '$pattern' for: $*"; }
  echo "ok: exit $rc, '$pattern'"
}
expect 1 "$tmp/none.jsonl: no such file" "$tmp/none.jsonl" -o "$tmp/x.png"
: >"$tmp/empty.jsonl"
expect 1 "$tmp/empty.jsonl: is empty" "$tmp/empty.jsonl" -o "$tmp/x.png"
{ head -2 "$tmp/m.jsonl"; echo '{"iteration": 3, "loss":'; } >"$tmp/bad.jsonl"
expect 1 "$tmp/bad.jsonl:3: not JSON" "$tmp/bad.jsonl" -o "$tmp/x.png"
{ head -1 "$tmp/m.jsonl"; echo '[1, 2]'; } >"$tmp/list.jsonl"
expect 1 "$tmp/list.jsonl:2: a JSON list, expected one object per line" "$tmp/list.jsonl" -o "$tmp/x.png"
{ head -1 "$tmp/m.jsonl"; echo '{"iteration": 2, "loss": "high"}'; } >"$tmp/str.jsonl"
expect 1 "$tmp/str.jsonl:2: iteration 2: \"loss\" is \"high\", not a number" "$tmp/str.jsonl" -o "$tmp/x.png"

expect 1 "$tmp/list.jsonl:2: a JSON list" "$tmp/m.jsonl" --compare "$tmp/list.jsonl" -o "$tmp/x.png"
expect 2 "the extension must be .png or .svg" "$tmp/m.jsonl" -o "$tmp/x.pdf"
expect 1 "$tmp/no/dir/x.png: cannot write" "$tmp/m.jsonl" -o "$tmp/no/dir/x.png"
[ ! -e "$tmp/x.png" ] || fail "a plot was written for a bad input"

# Without matplotlib (python -S: no site-packages) the script says so and exits 77.
if ! "$py" -S -c "import matplotlib" 2>/dev/null; then
  out=$("$py" -S "$script" "$tmp/m.jsonl" -o "$tmp/y.png" 2>&1); rc=$?
  [ $rc -eq 77 ] && grep -q "matplotlib is not installed" <<<"$out" || { echo "$out"; fail "no matplotlib: exit $rc"; }
  echo "ok: no matplotlib -> 77"
fi
echo "PASS"
