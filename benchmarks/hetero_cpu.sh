#!/usr/bin/env bash
# hetero_cpu.sh: the heterogeneous-cluster experiment of issue 29 on this 2-core CPU machine
# (docs/BENCHMARKS.md "Heterogeneous CPU classes").
#
#   benchmarks/hetero_cpu.sh [--train-bench PATH] [--triax-plan PATH] [--fast-coretype X] [--slow-coretype Y]
#                            [--slow-isa baseline|auto] [--np "2 4"] [--layouts "dp pp"] [--rounds N] [--iters N] [--out DIR]
#                            [--calibrate-only] [--no-planner]
#
# Two device classes of different speed on one machine: every rank of the "fast" class runs
# OpenBLAS's FAST_CORETYPE kernels on CPU 0, every rank of the "slow" class the older SLOW_CORETYPE
# kernels on CPU 1 (taskset; mpirun --bind-to none). The steps:
#  (a) for each np k, calibrate each class as it will run: train_bench --predict --fit-step
#      --write-cluster at np k, all ranks of the class, k/2 per core (rates per CPU second, i.e. per
#      full core, scaled to the class's own measured step) -> OUT/fast_np<k>.toml, OUT/slow_np<k>.toml;
#  (b) for np k in NPS: OUT/mixed_np<k>.toml, two [[node_class]] entries (base = the class file,
#      count 1 node, devices k/2, cores 1: the class's k/2 ranks time-slice its one core; no
#      network, so the planner prices both classes as one machine joined by shared memory);
#  (c) for np k and the layouts dp (pp 1, dp k: uneven DP shares) and pp (pp k, dp 1: uneven
#      stages): the even split and the planner's plan (triax-plan --cluster mixed --emit-config),
#      each timed by train_bench under the MPMD launch, alternating even / planned for ROUNDS
#      rounds (the machine's speed drifts: each round's ratio is printed);
#  (d) a markdown table (OUT/table.md): layout, plan, predicted, measured, measured/predicted, even
#      measured, speed-up planned/even, the classes' speed ratio.
#
# Placement (why these layouts): the planner's core-sharing model has a rank that waits give its
# core to another rank on that core. With one core per class that holds when the ranks sharing a
# core never wait together: dp-only (replicas compute in lockstep, no bubble) and pp-only (a core
# holds consecutive stages 0,1 or 2,3 of different stages; with the default order tp-dp-pp, stage s
# is world rank s, and MPMD numbers the fast context's ranks first). A pp x dp layout would put both
# replicas of a stage on the class's one core, where they wait together (measured 1.25-1.33x the
# model's time for pp 2 dp 2 on 2 cores, docs/PLANNER.md); it is left out.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

TRAIN_BENCH=${TRAIN_BENCH:-$here/build/benchmarks/train_bench}
TRIAX_PLAN=${TRIAX_PLAN:-$here/build/examples/triax_plan/triax-plan}
FAST_CORETYPE=${FAST_CORETYPE:-Haswell}   # this machine's default (the environment sets it)
SLOW_CORETYPE=${SLOW_CORETYPE:-Core2}     # SSE3 kernels: sgemm 2.5x slower, step 2.2-2.5x (docs/BENCHMARKS.md)
SLOW_ISA=${SLOW_ISA:-auto}                # TRIAX_CPU_ISA of the slow class (baseline also slows element-wise ops)
NPS=${NPS:-"2 4"}
LAYOUTS=${LAYOUTS:-"dp pp"}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
OUT=${OUT:-$here/build/hetero_cpu}
# train_bench's model (its defaults: 8 layers x 128 hidden, 4 heads, seq 128, vocab 256, global
# batch 32, micro-batch 4, fp32) and the same model for the planner.
# BENCH_MODEL applies to every run (model flags only: a --config run takes its layout and batch
# from the file); BENCH_BATCH to the runs given by flags (the even splits, --no-planner plans).
BENCH_MODEL=${BENCH_MODEL:-""}
BENCH_BATCH=${BENCH_BATCH:-"--micro-batch-size 4 --global-batch-size 32"}
PLAN_MODEL=${PLAN_MODEL:-"--layers 8 --hidden 128 --heads 4 --seq 128 --vocab 256 --global-batch 32 --precision fp32 --runtime-copies"}
# ---- the planner's flags (triax-plan with [[node_class]] clusters; adjust here if its CLI differs) ----
# ZeRO 0 and no recomputation, as the even runs (train_bench's defaults): the comparison is of the
# split alone (the runtime refuses uneven --dp-microbatches under ZeRO 2/3, and the planner keeps
# those shares equal).
PLAN_DP_FLAGS=${PLAN_DP_FLAGS:-"--tp 1 --pp 1 --dp {k} --mbs 4 --zero 0 --recompute none"}  # {k}: the world size
PLAN_PP_FLAGS=${PLAN_PP_FLAGS:-"--tp 1 --pp {k} --dp 1 --mbs 4 --zero 0 --recompute none"}
PLAN_EMIT=${PLAN_EMIT:-"--emit-config"}     # writes the train_gpt config of the best plan
PLAN_JSON=${PLAN_JSON:-"--json"}            # one JSON object: best[0].plan / best[0].even
PLAN_PRED_KEY=${PLAN_PRED_KEY:-"best.0.plan.seconds_per_iteration"}
PLAN_EVEN_KEY=${PLAN_EVEN_KEY:-"best.0.even.seconds_per_iteration"}
# Without the planner (--no-planner): the plans to time instead, per layout and np ("" skips).
PLANNED_dp_2=${PLANNED_dp_2:-"--pp 1 --dp 2 --dp-microbatches fast=6,slow=2"}
PLANNED_dp_4=${PLANNED_dp_4:-"--pp 1 --dp 4 --dp-microbatches fast=3,slow=1"}
PLANNED_pp_2=${PLANNED_pp_2:-"--pp 2 --dp 1 --pipeline-layers 6,2 --stage-classes fast,slow"}
PLANNED_pp_4=${PLANNED_pp_4:-"--pp 4 --dp 1 --pipeline-layers 3,3,1,1 --stage-classes fast,fast,slow,slow"}
# Other plans of the same layout to time beside the planner's (';' between plans; "" none), so
# the table shows whether the planner's choice was the fastest measured. Batch flags are added.
ALT_dp_2=${ALT_dp_2-"--pp 1 --dp 2 --dp-microbatches 5,3;--pp 1 --dp 2 --dp-microbatches 7,1"}
ALT_pp_2=${ALT_pp_2-"--pp 2 --dp 1 --pipeline-layers 5,3;--pp 2 --dp 1 --pipeline-layers 7,1"}
ALT_dp_4=${ALT_dp_4-"--pp 1 --dp 4 --dp-microbatches 4,2,1,1;--pp 1 --dp 4 --dp-microbatches 3,2,2,1"}
ALT_pp_4=${ALT_pp_4-"--pp 4 --dp 1 --pipeline-layers 2,3,2,1;--pp 4 --dp 1 --pipeline-layers 4,2,1,1"}
calibrate_only=0 use_planner=1

while [[ $# -gt 0 ]]; do
  case $1 in
    --train-bench) TRAIN_BENCH=$2; shift 2 ;;
    --triax-plan) TRIAX_PLAN=$2; shift 2 ;;
    --fast-coretype) FAST_CORETYPE=$2; shift 2 ;;
    --slow-coretype) SLOW_CORETYPE=$2; shift 2 ;;
    --slow-isa) SLOW_ISA=$2; shift 2 ;;
    --np) NPS=$2; shift 2 ;;
    --layouts) LAYOUTS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --calibrate-only) calibrate_only=1; shift ;;
    --no-planner) use_planner=0; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "hetero_cpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $TRAIN_BENCH ]] || { echo "hetero_cpu.sh: --train-bench $TRAIN_BENCH is not an executable" >&2; exit 2; }
if [[ $use_planner == 1 && ! -x $TRIAX_PLAN ]]; then
  echo "hetero_cpu.sh: --triax-plan $TRIAX_PLAN is not an executable (or pass --no-planner)" >&2; exit 2
fi
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
MPIRUN=(timeout 900 mpirun --oversubscribe --bind-to none)
one_thread=(-x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
class_env() {  # the -x flags of a class
  if [[ $1 == fast ]]; then echo "-x TRIAX_DEVICE_CLASS=fast -x OPENBLAS_CORETYPE=$FAST_CORETYPE"
  else echo "-x TRIAX_DEVICE_CLASS=slow -x OPENBLAS_CORETYPE=$SLOW_CORETYPE -x TRIAX_CPU_ISA=$SLOW_ISA"; fi
}
log() { echo "[hetero_cpu $(date -u +%H:%M:%S)] $*" >&2; }

# (a) Calibrate each class as it will run at np k: k ranks of the class, rank r on core r mod 2, so
# each core time-slices k/2 ranks as in the mixed run, and --fit-step scales the class's compute
# rates to its own measured training step (the kernels' calibration alone misses what ranks sharing
# a core cost each other: the fast class's np 4 step measured 1.16x its prediction; docs/BENCHMARKS.md).
calibrate() {  # k class
  local k=$1 cls=$2
  log "calibrating class $cls at np $k ($(class_env $cls))"
  # shellcheck disable=SC2046
  "${MPIRUN[@]}" -np "$k" "${one_thread[@]}" $(class_env $cls) bash -c 'exec taskset -c $((OMPI_COMM_WORLD_RANK % 2)) "$@"' _ \
    "$TRAIN_BENCH" $BENCH_MODEL $BENCH_BATCH --iters "$ITERS" --warmup "$WARMUP" --overlap on --predict --fit-step --label "$cls" \
    --json "$OUT/calibrate_${cls}_np$k.json" --write-cluster "$OUT/${cls}_np$k.toml" > "$OUT/calibrate_${cls}_np$k.txt" 2>&1 ||
    { cat "$OUT/calibrate_${cls}_np$k.txt"; exit 1; }
  grep -E "^measured|^wrote" "$OUT/calibrate_${cls}_np$k.txt" >&2
}
if [[ $calibrate_only == 1 ]]; then
  for k in $NPS; do calibrate "$k" fast; calibrate "$k" slow; done
  log "calibrated: $OUT/{fast,slow}_np*.toml"; exit 0
fi

# (b) The mixed cluster of np k: one node per class, k/2 ranks on its one core.
write_mixed() {  # k
  python3 - "$OUT" "$1" <<'PY'
import sys
out, k = sys.argv[1], int(sys.argv[2])
classes = "".join(f'''
[[node_class]]
name = "{c}"
base = "{c}_np{k}.toml"   # calibrated by train_bench --write-cluster at np {k}
count = 1
node = {{ devices = {k // 2}, cores = 1 }}   # the class's ranks time-slice its one core (taskset)
''' for c in ("fast", "slow"))
open(f"{out}/mixed_np{k}.toml", "w").write(f'''# hetero_cpu.sh: the two CPU classes of this machine at np {k}, one "node" each.
name = "cpu-mixed-np{k}"
description = "fast and slow OpenBLAS kernels on one 2-core machine, {k // 2} rank(s) per class on one core"
# No [between_classes]: classes without a network (nics_per_node = 0, as train_bench writes them)
# are priced as one machine joined by its shared-memory link (docs/PLANNER.md).
{classes}''')
PY
}

# Runs train_bench on k ranks, half per class (fast first: world ranks 0..k/2-1), under the MPMD launch.
run_mpmd() {  # k tag args...
  local k=$1 tag=$2 h=$(($1 / 2)); shift 2
  local model args
  read -r -a model <<< "$BENCH_MODEL"
  args=("$TRAIN_BENCH" "${model[@]}" --iters "$ITERS" --warmup "$WARMUP" --overlap on "$@")
  # shellcheck disable=SC2046
  "${MPIRUN[@]}" -np $h "${one_thread[@]}" $(class_env fast) taskset -c 0 "${args[@]}" : \
    -np $h "${one_thread[@]}" $(class_env slow) taskset -c 1 "${args[@]}" > "$OUT/$tag.txt" 2>&1 ||
    { cat "$OUT/$tag.txt" >&2; return 1; }
  grep "^train_bench_result " "$OUT/$tag.txt" | head -1 | cut -d' ' -f2-
}

json_key() {  # file dotted.key
  python3 -c 'import json,sys
v = json.load(open(sys.argv[1]))
for p in sys.argv[2].split("."): v = v[int(p)] if isinstance(v, list) else v[p]
print(v)' "$1" "$2"
}

results=$OUT/results.jsonl
: > "$results"
# plan_layout k layout r: the planner's plan of this round's calibration (cfg file, predictions).
plan_layout() {
  local k=$1 layout=$2 r=$3 flags
  if [[ $layout == dp ]]; then flags=${PLAN_DP_FLAGS//\{k\}/$k}; else flags=${PLAN_PP_FLAGS//\{k\}/$k}; fi
  cfg=$OUT/plan_${layout}_np${k}_r$r.toml
  log "planning $layout at np $k: triax-plan --cluster mixed_np$k.toml $flags"
  # shellcheck disable=SC2086
  "$TRIAX_PLAN" --cluster "$OUT/mixed_np$k.toml" $PLAN_MODEL $flags $PLAN_EMIT "$cfg" $PLAN_JSON \
    > "$OUT/plan_${layout}_np${k}_r$r.json" 2> "$OUT/plan_${layout}_np${k}_r$r.err" ||
    { cat "$OUT/plan_${layout}_np${k}_r$r.err" >&2; exit 1; }
  predicted=$(json_key "$OUT/plan_${layout}_np${k}_r$r.json" "$PLAN_PRED_KEY")
  predicted_even=$(json_key "$OUT/plan_${layout}_np${k}_r$r.json" "$PLAN_EVEN_KEY")
  planned=(--config "$cfg")
}

results=$OUT/results.jsonl
: > "$results"
for k in $NPS; do
  # Each round calibrates both classes again, just before its runs: the machine's speed drifts by
  # up to 10% over minutes, and a prediction is only as good as the calibration's moment.
  for ((r = 1; r <= ROUNDS; r++)); do
    calibrate "$k" fast
    calibrate "$k" slow
    cp "$OUT/fast_np$k.toml" "$OUT/fast_np${k}_r$r.toml"; cp "$OUT/slow_np$k.toml" "$OUT/slow_np${k}_r$r.toml"
    write_mixed "$k"
    for layout in $LAYOUTS; do
      read -r -a batch <<< "$BENCH_BATCH"
      if [[ $layout == dp ]]; then even=(--pp 1 --dp "$k" "${batch[@]}"); else even=(--pp "$k" --dp 1 "${batch[@]}"); fi
      predicted="" predicted_even="" planned=()
      if [[ $use_planner == 1 ]]; then
        plan_layout "$k" "$layout" "$r"
      else
        var=PLANNED_${layout}_$k
        [[ -n ${!var:-} ]] || { log "no plan for $layout at np $k (set $var)"; continue; }
        read -r -a planned <<< "${!var} $BENCH_BATCH"
      fi
      log "np $k $layout round $r: even ${even[*]} | planned ${planned[*]}"
      # Alternate which runs first, so that a drift inside a round does not favour one.
      if ((r % 2)); then
        e=$(run_mpmd "$k" "even_${layout}_np${k}_r$r" "${even[@]}")
        p=$(run_mpmd "$k" "plan_${layout}_np${k}_r$r" "${planned[@]}")
      else
        p=$(run_mpmd "$k" "plan_${layout}_np${k}_r$r" "${planned[@]}")
        e=$(run_mpmd "$k" "even_${layout}_np${k}_r$r" "${even[@]}")
      fi
      alts=$OUT/alts_${layout}_np${k}_r$r.jsonl
      : > "$alts"
      altvar=ALT_${layout}_$k
      IFS=';' read -r -a altlist <<< "${!altvar:-}"
      for i in "${!altlist[@]}"; do
        read -r -a aflags <<< "${altlist[$i]} $BENCH_BATCH"
        run_mpmd "$k" "alt${i}_${layout}_np${k}_r$r" "${aflags[@]}" >> "$alts"
      done
      python3 - "$k" "$layout" "$r" "${planned[*]}" "$predicted" "$predicted_even" "$e" "$p" "$alts" >> "$results" <<'PY'
import json, sys
k, layout, r, plan, pred, pred_even, e, p, alts = sys.argv[1:10]
e, p = json.loads(e), json.loads(p)
alts = [json.loads(l) for l in open(alts) if l.strip()]
print(json.dumps({"np": int(k), "layout": layout, "round": int(r), "plan": plan,
                  "predicted_s": float(pred) if pred else None, "predicted_even_s": float(pred_even) if pred_even else None,
                  "even": e, "planned": p, "alternatives": alts}))
print(f"np {k} {layout} round {r}: even {e['step_ms']:.1f} ms, planned {p['step_ms']:.1f} ms, "
      f"even/planned {e['step_ms'] / p['step_ms']:.2f}; predicted planned {float(pred) * 1e3 if pred else 0:.1f} ms "
      f"(measured/predicted {p['step_ms'] / (float(pred) * 1e3) if pred else 0:.2f}) (CPU share of the compute: even "
      f"{e['cpu_share']:.2f}, planned {p['cpu_share']:.2f}; load average {p['load_average']})", file=sys.stderr)
PY
    done
  done
done

# (d) The table.
python3 - "$results" "$SLOW_CORETYPE" "$FAST_CORETYPE" "$SLOW_ISA" > "$OUT/table.md" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
slow, fast, isa = sys.argv[2:5]
med = statistics.median
def plan_text(p):
    if p["config"]:  # the planner's own summary of the plan: the file's second comment line
        try:
            lines = open(p["config"]).read().splitlines()
            if len(lines) > 1 and lines[1].startswith("#"): return lines[1].lstrip("# ").replace("|", "/")
        except OSError:
            pass
    parts = [f"tp{p['tp']} pp{p['pp']} dp{p['dp']}",
             "layers " + ",".join(map(str, p["stage_layers"])) if p["pp"] > 1 else "",
             f"stages on {p['stage_classes']}" if p["stage_classes"] else "",
             f"micro-batches {p['dp_microbatches']}" if p["dp_microbatches"] else "",
             f"from {p['config'].rsplit('/', 1)[-1]}" if p["config"] else ""]
    return "; ".join(x for x in parts if x)
def class_ratio(run):
    c = run["classes"]
    return c["slow"]["compute_cpu_ms"] / c["fast"]["compute_cpu_ms"] if "slow" in c and "fast" in c else float("nan")
import os, tomllib
out = os.path.dirname(sys.argv[1])
print(f"Classes: fast = OPENBLAS_CORETYPE={fast} on CPU 0, slow = OPENBLAS_CORETYPE={slow} TRIAX_CPU_ISA={isa} on CPU 1.")
for k in sorted({r["np"] for r in rows}):
    cal = {c: tomllib.load(open(f"{out}/{c}_np{k}.toml", "rb")) for c in ("fast", "slow")}
    rate = lambda c, sec, key, scale=1: scale * cal[c][sec][key]
    print(f"Calibrated at np {k}, last round (train_bench --fit-step --write-cluster, {k} ranks of the class, {k // 2} per core): sgemm fast "
          f"{rate('fast', 'compute', 'peak_tflops_fp32', 1e3):.1f}, slow {rate('slow', 'compute', 'peak_tflops_fp32', 1e3):.1f} GFLOP/s "
          f"({cal['fast']['compute']['peak_tflops_fp32'] / cal['slow']['compute']['peak_tflops_fp32']:.2f}x); attention "
          f"{rate('fast', 'compute', 'attention_efficiency'):.2f} / {rate('slow', 'compute', 'attention_efficiency'):.2f} of it; "
          f"element-wise {rate('fast', 'memory', 'bandwidth_gbps'):.1f} / {rate('slow', 'memory', 'bandwidth_gbps'):.1f} GB/s.")
print()
print("| np | layout | plan | predicted (ms) | measured (ms) | measured/predicted (per round) | even predicted (ms) | even measured (ms) "
      "| speed-up planned/even | per-round even/planned | class speed ratio (even run, CPU time) "
      "| other plans measured (ms) | planned fastest |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
keys = sorted({(r["np"], r["layout"]) for r in rows})
for k, layout in keys:
    rs = [r for r in rows if r["np"] == k and r["layout"] == layout]
    m = med([r["planned"]["step_ms"] for r in rs])
    ev = med([r["even"]["step_ms"] for r in rs])
    pred = med([r["predicted_s"] for r in rs]) if rs[0]["predicted_s"] else None
    pe = med([r["predicted_even_s"] for r in rs]) if rs[0]["predicted_even_s"] else None
    mp = ", ".join(f"{r['planned']['step_ms'] / (1e3 * r['predicted_s']):.2f}" for r in rs) if pred else "-"
    plans = sorted({plan_text(r["planned"]) for r in rs})
    rounds = ", ".join(f"{r['even']['step_ms'] / r['planned']['step_ms']:.2f}" for r in rs)
    ratio = med([class_ratio(r["even"]) for r in rs])
    fmt = lambda x: f"{1e3 * x:.1f}" if x else "-"
    alt = {}
    for r in rs:
        for a in r.get("alternatives", []):
            name = ",".join(map(str, a["stage_layers"])) if a["pp"] > 1 else a["dp_microbatches"]
            alt.setdefault(name, []).append(a["step_ms"])
    alts = "; ".join(f"{n}: {med(v):.1f}" for n, v in alt.items()) or "-"
    fastest = "yes" if all(m <= med(v) for v in alt.values()) else "no"
    print(f"| {k} | {layout} | {' or '.join(plans)} | {fmt(pred)} | {m:.1f} | "
          f"{m / (1e3 * pred) if pred else float('nan'):.2f} ({mp}) | {fmt(pe)} | {ev:.1f} | {ev / m:.2f} | {rounds} | {ratio:.2f} "
          f"| {alts} | {fastest if alt else '-'} |")
PY
cat "$OUT/table.md"
log "results: $results, table: $OUT/table.md"
