#!/usr/bin/env bash
# scripts/prepare_data.py on its byte-level fallback, end to end: text files -> llm.c shards and a
# Megatron dataset with a train/validation split whose bytes are exactly the input's; then
# train_gpt trains on them (glob of shards; Megatron prefix with EOD-respecting samples) and
# reports validation loss in Megatron's words, in the log and the metrics JSONL.
#   prepare_data_test.sh PREPARE_DATA TRAIN_GPT MPIEXEC
set -uo pipefail
prep=$1; exe=$2; mpiexec=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { timeout 300 "$mpiexec" --oversubscribe "$@"; }

# 12 documents of a repetitive (learnable) text, different lengths.
mkdir -p "$tmp/corpus"
for i in $(seq 1 12); do
  for j in $(seq 1 $((20 + i * 3))); do printf 'the cat sat on the mat %d. ' $((j % 5)); done >"$tmp/corpus/doc$i.txt"
done
total=$(cat "$tmp/corpus"/*.txt | wc -c)

python3 "$prep" "$tmp"/corpus/*.txt --out-dir "$tmp/llmc" --name tiny --val-fraction 0.2 --shard-tokens 3000 >"$tmp/s1.json" \
  || fail "prepare_data (llmc) failed"
python3 "$prep" "$tmp"/corpus/*.txt --out-dir "$tmp/mega" --name tiny --format megatron --val-fraction 0.2 >"$tmp/s2.json" \
  || fail "prepare_data (megatron) failed"
python3 - "$tmp" "$total" <<'PY' || fail "prepared files"
import json, struct, sys, glob, os
tmp, total = sys.argv[1], int(sys.argv[2])
s1 = json.load(open(f"{tmp}/s1.json")); s2 = json.load(open(f"{tmp}/s2.json"))
for s in (s1, s2):
    assert s["tokenizer"] == "byte" and s["vocab"] == 256, s
    assert s["train"]["tokens"] + s["val"]["tokens"] == total, (s, total)  # every byte, once
    assert s["train"]["documents"] + s["val"]["documents"] == 12, s
    assert s["val"]["documents"] >= 1 and s["train"]["documents"] >= 1, s
assert s1["train"]["documents"] == s2["train"]["documents"]  # same seeded split
assert len(s1["train"]["files"]) >= 2, s1  # sharded at 3000 tokens
# llm.c headers: magic, version, count = file size.
n = 0
for f in s1["train"]["files"]:
    h = struct.unpack("<3i", open(f, "rb").read(12))
    assert h[0] == 20240520 and h[1] == 1 and 1024 + 2 * h[2] == os.path.getsize(f), (f, h)
    n += h[2]
assert n == s1["train"]["tokens"]
# Megatron index: magic, version, uint16, document count.
idx = open(f"{tmp}/mega/tiny_train_text_document.idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", idx[9:17])[0] == 1 and idx[17] == 8
S, D = struct.unpack("<QQ", idx[18:34])
assert S == s2["train"]["documents"] and D == S + 1
# The training bytes of the Megatron .bin are the concatenated training documents' bytes.
data = open(f"{tmp}/mega/tiny_train_text_document.bin", "rb").read()
assert len(data) == 2 * s2["train"]["tokens"]
print("prepared:", s1["train"], s1["val"]["tokens"])
PY

# Progress on stderr: a plain line per document at --progress-interval 0 (the percentage of the
# input read rising to 100, the tokens so far, tokens/s, ETA), then the totals; stdout stays the summary.
python3 "$prep" "$tmp"/corpus/*.txt --out-dir "$tmp/p" --val-fraction 0.2 --progress plain --progress-interval 0 \
  >"$tmp/p.json" 2>"$tmp/p.err" || fail "prepare_data --progress plain failed"
python3 - "$tmp/p.err" "$tmp/p.json" "$total" <<'PY' || { cat "$tmp/p.err"; fail "progress lines"; }
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
total = int(sys.argv[3])
json.loads(open(sys.argv[2]).read().splitlines()[-1])  # stdout: still the JSON summary
pat = re.compile(r"^prepare_data: +([0-9.]+)% of ([0-9.]+) MiB read \| tokens: (\d+) \| tokens/s: (\d+) \| ETA: \d+:\d\d:\d\d$")
rows = [pat.match(l) for l in lines[:-1]]
assert len(rows) == 12 and all(rows), lines  # one per document
pct = [float(m.group(1)) for m in rows]
tokens = [int(m.group(3)) for m in rows]
assert pct == sorted(pct) and pct[-1] == 100.0 and tokens == sorted(tokens) and tokens[-1] == total, (pct, tokens)
done = re.match(r"^prepare_data: done: [0-9.]+ MiB read, (\d+) tokens in [0-9.]+ s \(tokens/s: \d+\)$", lines[-1])
assert done and int(done.group(1)) == total, lines[-1]  # byte tokenizer: one token per byte
print("ok: progress", pct[0], "...", pct[-1])
PY
if python3 -c "import tqdm" 2>/dev/null; then
  python3 "$prep" "$tmp"/corpus/*.txt --out-dir "$tmp/p" --progress tqdm >/dev/null 2>"$tmp/t.err" || fail "--progress tqdm failed"
  grep -q "prepare_data: done: " "$tmp/t.err" || fail "no totals line under tqdm"
else
  out=$(python3 "$prep" "$tmp"/corpus/*.txt --out-dir "$tmp/p" --progress tqdm 2>&1) && fail "--progress tqdm without tqdm accepted"
  grep -q "the tqdm module is not importable" <<<"$out" || fail "no clear message for --progress tqdm without tqdm: $out"
fi

# Bad input: a tokenizer that is not installed, or unknown, fails with a clear message.
out=$(python3 "$prep" "$tmp"/corpus/doc1.txt --out-dir "$tmp/x" --tokenizer nonesuch 2>&1) && fail "unknown tokenizer accepted"
grep -q "unknown --tokenizer 'nonesuch'" <<<"$out" || fail "no clear tokenizer error: $out"
out=$(python3 "$prep" "$tmp"/nonexistent.txt --out-dir "$tmp/x" 2>&1) && fail "missing input accepted"
grep -q "nonexistent.txt: cannot read" <<<"$out" || fail "no clear missing-file error: $out"

common=(--model nano --vocab-size 256 --num-layers 2 --seq-length 16 --micro-batch-size 2 --num-micro-batches 2
        --train-iters 40 --lr 1e-2 --eval-interval 20 --eval-iters 2)
run -np 2 "$exe" "${common[@]}" --pp 2 --data "$tmp/llmc/tiny_train_*.bin" --valid-data "$tmp/llmc/tiny_val_000000.bin" \
  --metrics-jsonl "$tmp/m1.jsonl" --metrics-textfile "$tmp/m1.prom" >"$tmp/out1" 2>&1 || { tail -20 "$tmp/out1"; fail "train_gpt on llm.c shards failed"; }
run -np 2 "$exe" "${common[@]}" --data "$tmp/mega/tiny_train_text_document" --data-respect-eod \
  --valid-data "$tmp/mega/tiny_val_text_document" --metrics-jsonl "$tmp/m2.jsonl" >"$tmp/out2" 2>&1 \
  || { tail -20 "$tmp/out2"; fail "train_gpt on the Megatron dataset failed"; }
for k in 1 2; do
  grep -q "shuffled per epoch" "$tmp/out$k" || fail "run $k: the data line does not say it is shuffled"
  grep -qE "^ validation loss at iteration 20 \| lm loss value: [0-9.]+E[+-][0-9]+ \| lm loss PPL: [0-9.]+E[+-][0-9]+ \|" \
    "$tmp/out$k" || { grep -i valid "$tmp/out$k"; fail "run $k: no Megatron validation line"; }
  # Each pass says what it scored (eval-iters 2 x the global batch x seq 16, checked below) and how long it took.
  [ "$(grep -cE "^ validation loss at iteration (20|40) \| .* \| tokens: [0-9]+ \| time \(s\): [0-9.]+ \| $" "$tmp/out$k")" -eq 2 ] ||
    { grep -i "validation loss" "$tmp/out$k"; fail "run $k: the validation passes do not say their tokens and time"; }
  # The summary's final and best validation loss are the JSONL's last and lowest.
  python3 - "$tmp/m$k.jsonl" "$tmp/out$k" <<'PY' || fail "run $k: the summary's validation loss"
import json, re, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if "valid_loss" in l]
line = re.search(r"^ run summary \| validation loss: final (\S+) \(iteration (\d+)\), best (\S+) \(iteration (\d+)\)$",
                 open(sys.argv[2]).read(), re.M)
assert line, "no validation loss in the run summary"
best = min(ev, key=lambda r: r["valid_loss"])
logged = [int(t) for t in re.findall(r"^ validation loss at iteration \d+ \| .* \| tokens: (\d+) \|", open(sys.argv[2]).read(), re.M)]
assert logged == [r["valid_tokens"] for r in ev] == [r["valid_samples"] * 16 for r in ev], (logged, ev)
assert all(r["valid_samples"] == 2 * r2["global_batch_size"] for r in ev
           for r2 in [json.loads(l) for l in open(sys.argv[1]) if '"global_batch_size"' in l][:1]), ev
assert float(line.group(1)) == float(f"{ev[-1]['valid_loss']:.6E}") and int(line.group(2)) == ev[-1]["iteration"], line.group(0)
assert float(line.group(3)) == float(f"{best['valid_loss']:.6E}") and int(line.group(4)) == best["iteration"], line.group(0)
print("ok:", line.group(0))
PY
  python3 - "$tmp/m$k.jsonl" <<'PY' || fail "run $k: metrics"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ev = [r for r in rows if "valid_loss" in r]
tr = [r for r in rows if "loss" in r]
assert [r["iteration"] for r in ev] == [20, 40], ev
assert len(tr) == 40
for r in ev:
    assert abs(r["valid_ppl"] - math.exp(r["valid_loss"])) < 1e-9 * r["valid_ppl"], r
# Byte-level text of one repeated sentence: validation loss far below ln(256) = 5.55 and falling.
assert ev[-1]["valid_loss"] < ev[0]["valid_loss"] < 5.0, ev
print("valid:", [round(r["valid_loss"], 4) for r in ev])
PY
done
# The Prometheus textfile carries the last validation pass, as the JSONL has it.
python3 - "$tmp/m1.jsonl" "$tmp/m1.prom" <<'PY' || fail "validation metrics in the textfile"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if "valid_loss" in l][-1]
prom = {k: float(v) for k, v in (l.rsplit(" ", 1) for l in open(sys.argv[2]) if l.strip() and not l.startswith("#"))}
assert prom["triax_validation_loss"] == ev["valid_loss"], (prom["triax_validation_loss"], ev)
assert prom["triax_validation_ppl"] == ev["valid_ppl"] and prom["triax_validation_iteration"] == ev["iteration"], prom
print("textfile validation loss", prom["triax_validation_loss"])
PY
grep -q "samples inside documents" "$tmp/out2" || fail "EOD-respecting samples not reported"

# Flags: file order on request; EOD needs documents; validation needs a validation set.
run -np 1 "$exe" --model nano --vocab-size 256 --seq-length 16 --train-iters 1 --no-data-shuffle \
  --data "$tmp/llmc/tiny_train_*.bin" >"$tmp/out3" 2>&1 || { tail -5 "$tmp/out3"; fail "--no-data-shuffle run failed"; }
grep -q "in file order" "$tmp/out3" || fail "--no-data-shuffle not reported"
for args in "--data-respect-eod|has no document boundaries" "--eval-interval 5|no validation set was given (--valid-data)" \
            "--valid-data $tmp/llmc/none.bin --eval-interval 5|none.bin: no such file"; do
  flags=${args%%|*}; pattern=${args#*|}
  out=$(run -np 1 "$exe" --model nano --vocab-size 256 --seq-length 16 --train-iters 1 --data "$tmp/llmc/tiny_train_*.bin" $flags 2>&1) \
    && fail "accepted: $flags"
  grep -qF -- "$pattern" <<<"$out" || { echo "$out" | tail -3; fail "no '$pattern' for: $flags"; }
  echo "ok: '$pattern' for: $flags"
done
echo PASS
