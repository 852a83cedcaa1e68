#!/usr/bin/env bash
# Mean time to repair of train_gpt under torchrun's elastic agent (issue 30): two agents on this
# machine ("nodes") x 2 workers each (world 4, tp T x dp 2), c10d rendezvous on 127.0.0.1, --save and
# --load on one temporary directory. For each model and each scenario:
#   node  - SIGKILL to the second agent's process group (agent + its workers) a few iterations after a
#           committed save; the first agent re-forms at world 2 (tp T x dp 1) and resumes;
#   fault - TRIAX_FAULT=R:I:kill on one rank, in the first attempt only (a wrapper checks
#           TORCHELASTIC_RESTART_COUNT=0), both agents alive: the group restarts at world 4.
# MTTR on this script's clock: from the kill (node: just before `kill`; fault: when the wrapper sees
# its worker die) to the arrival, in the agents' output, of the first iteration line of the new
# attempt (each output line is stamped as it arrives; PYTHONUNBUFFERED keeps the agent's tee from
# buffering). Beside it, the worker's own account (rank 0's `elastic: training resumed ...` line:
# agents + rendezvous / start-up and resume / first iteration), the lost-work part of the
# `elastic: attempt ...` line, the checkpoint size and save time (`saved checkpoint` line of the
# save resumed from) and its load time (`loaded checkpoint`). --models takes MODEL[:SEQ_LENGTH] (a
# preset of train_gpt --model; without :SEQ_LENGTH the preset's own, e.g. tiny's 64).
#
#   benchmarks/elastic_mttr.sh [BUILD_DIR] [--models gpt2-124m:128,tiny] [--tp 2]
#       [--save-interval 5] [--kill-after 3] [--fault-rank 3] [--scenarios node,fault] [--limit 840]
#       [--keep DIR]
#
# The agents run with --monitor_interval 1 --rdzv_conf last_call_timeout=1 (the defaults, 5 s and
# 30 s, would add to every restart). A lost node costs more than a failed worker: torch 1.13's c10d
# rendezvous drops a node only after 3 missed keep-alive heartbeats 5 s apart (fixed in
# DynamicRendezvousHandler.from_backend, not settable by --rdzv_conf), so node loss has a floor of
# about 15 s before the survivors can form the new round. Global batch 4, micro-batch 1 (the box
# has 2 cores); every wait is bounded and the whole run stops at --limit seconds (default 14 min).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build
if [[ $# -gt 0 && $1 != --* ]]; then build=$1; shift; fi
models=gpt2-124m:128,tiny tp=2 save_every=5 kill_after=3 fault_rank=3 scenarios=node,fault limit=840 keep=
while [[ $# -gt 0 ]]; do
  case $1 in
    --models) models=$2 ;; --tp) tp=$2 ;; --save-interval) save_every=$2 ;;
    --kill-after) kill_after=$2 ;; --fault-rank) fault_rank=$2 ;; --scenarios) scenarios=$2 ;;
    --limit) limit=$2 ;; --keep) keep=$2 ;;
    *) echo "elastic_mttr.sh: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
  shift 2
done
exe=$(realpath "$build")/examples/train_gpt/train_gpt
torchrun=/usr/bin/torchrun
py=/usr/bin/python3
[[ -x $exe ]] || { echo "elastic_mttr.sh: no train_gpt at $exe (build the train_gpt target)" >&2; exit 2; }
[[ -x $torchrun ]] || { echo "elastic_mttr.sh: $torchrun absent (Debian python3-torch)" >&2; exit 77; }
((kill_after >= 1 && kill_after < save_every)) || { echo "elastic_mttr.sh: need 1 <= --kill-after < --save-interval" >&2; exit 2; }
end_at=$((SECONDS + limit))
tmp=$(mktemp -d /tmp/elastic_mttr.XXXXXX)
groups=()
cleanup() {
  local g
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  if [[ -n $keep ]]; then mkdir -p "$keep"; cp "$tmp"/*.log "$tmp"/rows.tsv "$keep"/ 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 143' TERM INT
export PYTHONUNBUFFERED=1

# Each line of the agent's output with the time it arrived (s since the epoch).
stamp() { local l; while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }

# The worker: exec train_gpt, except on the fault rank of the first attempt, where it runs with
# TRIAX_FAULT and records when it died.
cat >"$tmp/worker.sh" <<'EOF'
#!/bin/bash
if [[ -n ${MTTR_FAULT:-} && ${TORCHELASTIC_RESTART_COUNT:-0} == 0 && ${RANK:-} == "$MTTR_FAULT_RANK" ]]; then
  TRIAX_FAULT=$MTTR_FAULT "$MTTR_EXE" "$@"
  rc=$?
  echo "$EPOCHREALTIME" >"$MTTR_FAULT_TIME"
  exit $rc
fi
exec "$MTTR_EXE" "$@"
EOF
chmod +x "$tmp/worker.sh"

# Start one agent in its own process group (setsid: the group id is its pid); sets $agent.
start_agent() {  # DIR NAME PORT ARGS...
  local dir=$1 name=$2 port=$3; shift 3
  (cd "$dir" && exec setsid "$torchrun" --nnodes 1:2 --nproc_per_node 2 --max_restarts 3 --rdzv_backend c10d \
     --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "mttr-$(basename "$dir")" --redirects 2 --tee 2 \
     --monitor_interval 1 --rdzv_conf last_call_timeout=1 --log_dir "$dir/tlog_$name" --no_python \
     "$tmp/worker.sh" "$@" > >(stamp >"$dir/$name.log") 2>&1) &
  agent=$!
  disown "$agent"  # no "Killed" job report when the script ends it
  groups+=("$agent")
}

merged() { sort -s -n -k1,1 "$1"/a.log "$1"/b.log 2>/dev/null; }

# The iteration at which to act: the first iteration line >= SAVED + K after a committed save of
# the current attempt, where that attempt runs at world 4. Prints it, or nothing yet.
ready_iteration() {  # DIR
  merged "$1" | awk -v K="$kill_after" '
    / elastic: attempt [0-9]+ of run / { ok = ($0 ~ /\(world 4\); (resumed|no checkpoint)/); saved = -1; next }
    ok && saved < 0 && /saved checkpoint [^ ]*iter_[0-9]+ / {
      s = $0; sub(/.*saved checkpoint [^ ]*iter_0*/, "", s); sub(/ .*/, "", s); saved = s + 0; next }
    ok && saved >= 0 && / iteration +[0-9]+\/ *[0-9]+ \|/ {
      match($0, / iteration +[0-9]+\//); s = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", s)
      if (s + 0 >= saved + K) { print s; exit } }'
}

# 0 when the first iteration line of an attempt started after T has arrived (and rank 0's
# "training resumed" line).
resumed_after() {  # DIR T
  merged "$1" | awk -v T="$2" '
    $1 > T && / elastic: attempt [0-9]+ of run / { att = 1 }
    att && / iteration +[0-9]+\/ *[0-9]+ \|/ { it = 1 }
    $1 > T && / elastic: training resumed / { tr = 1 }
    END { exit !(it && tr) }'
}

wait_until() {  # SECONDS-CAP COMMAND...: poll every 50 ms; 1 on time-out or when the first agent ended
  local cap=$1; shift
  local stop=$((SECONDS + cap)); ((stop < end_at)) || stop=$end_at
  until "$@"; do ((SECONDS < stop)) && kill -0 "$a" 2>/dev/null || return 1; sleep 0.05; done
}
nonempty() { [[ -n $("$@") ]]; }

stop_groups() {
  local g
  for g in "$@"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  for g in "$@"; do while kill -0 -- "-$g" 2>/dev/null; do sleep 0.1; done; done
}

# One measurement: writes a row to rows.tsv (or a failure row).
run_case() {  # MODEL[:SEQ] SCENARIO
  local model=${1%%:*} seq=${1#*:} scen=$2 dir="$tmp/${1%%:*}-$2" port a b t0 it fault_it=
  [[ $1 == *:* ]] || seq=
  mkdir -p "$dir"
  port=$("$py" "$here/../tests/cluster/free_ports.py" 1)
  local args=(--model "$model" --tp "$tp" ${seq:+--seq-length "$seq"} --global-batch-size 4 --micro-batch-size 1
              --train-iters 1000 --save "$dir/ck" --load "$dir/ck" --save-interval "$save_every" --seed 3)
  export MTTR_EXE=$exe MTTR_FAULT="" MTTR_FAULT_RANK=$fault_rank MTTR_FAULT_TIME=$dir/fault_time
  if [[ $scen == fault ]]; then
    fault_it=$((save_every + kill_after + 1))
    MTTR_FAULT=$fault_rank:$fault_it:kill
  fi
  local began=$SECONDS
  start_agent "$dir" a "$port" "${args[@]}"; a=$agent
  sleep 0.5  # the first agent hosts the c10d store: it binds the endpoint first
  start_agent "$dir" b "$port" "${args[@]}"; b=$agent
  local why=
  if [[ $scen == node ]]; then
    if wait_until 400 nonempty ready_iteration "$dir"; then
      it=$(ready_iteration "$dir")
      t0=$EPOCHREALTIME
      kill -KILL -- "-$b" 2>/dev/null || true
    else why="no committed save then $kill_after iterations at world 4 (time-out or the job ended)"; fi
  else
    if wait_until 400 test -s "$dir/fault_time"; then t0=$(<"$dir/fault_time"); it=$((fault_it - 1))
    else why="the injected fault did not fire (time-out or the job ended)"; fi
  fi
  if [[ -z $why ]] && ! wait_until 300 resumed_after "$dir" "$t0"; then why="no iteration after the restart (time-out or the job ended)"; fi
  stop_groups "$a" "$b"
  local wall=$((SECONDS - began))
  merged "$dir" >"$dir/merged.log"
  cp "$dir/merged.log" "$tmp/$model-$scen.log"
  if [[ -n $why ]]; then
    printf '%s\t%s\tFAILED: %s (logs: --keep DIR)\n' "$model" "$scen" "$why" >>"$tmp/rows.tsv"
    return 0
  fi
  "$py" - "$dir" "$model" "$scen" "$t0" "$it" "$wall" "$save_every" >>"$tmp/rows.tsv" <<'PY'
import glob, json, re, statistics, sys
d, model, scen, t0, it, wall, every = *sys.argv[1:4], float(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
lines = []
for l in open(f"{d}/merged.log", errors="replace"):
    ts, _, text = l.rstrip("\n").partition(" ")
    lines.append((float(ts), text))
def first(pred, after=t0):
    return next(((t, x) for t, x in lines if t > after and pred(x)), (None, None))
it_re = re.compile(r" iteration +(\d+)/ *\d+ \|.*elapsed time per iteration \(ms\): ([\d.]+)")
ta, att = first(lambda x: "elastic: attempt " in x and " of run " in x)
t1, first_it = first(lambda x: it_re.search(x) is not None, ta)
_, resumed = first(lambda x: "elastic: training resumed" in x)
_, loaded = first(lambda x: "loaded checkpoint" in x)
num = lambda pat, s: float(re.search(pat, s).group(1)) if s and re.search(pat, s) else float("nan")
frm = int(num(r"resumed from iteration (\d+)", att))
worlds = re.findall(r"\(world (\d+)\)", att)
saved = next((x for t, x in lines if t < t0 and re.search(rf"saved checkpoint \S*iter_0*{frm} ", x)), "")
steady = [float(m.group(2)) for t, x in lines if t < t0 and (m := it_re.search(x)) and int(m.group(1)) > 1
          and int(m.group(1)) % every != 1]
ends = [json.load(open(p))["unix_s"] for p in glob.glob(f"{d}/ck/elastic/interrupted.*.json")]
notice = min((e for e in ends if e > t0 - 5), default=float("nan")) - t0
lost_it = int(num(r"lost (\d+) iteration", att))
lost_s = num(r"iterations? \((?:about )?([\d.]+) s of", att)
# Correctness beside the timing: the first iteration after the restart must log the loss that
# iteration had in attempt 1 (the same samples and state, at any layout; 1e-5 relative).
loss_re = re.compile(r" iteration +(\d+)/.*lm loss: ([0-9.E+-]+)")
m_new = loss_re.search(first_it or "")
old_loss = next((float(m.group(2)) for t, x in lines if t < t0 and (m := loss_re.search(x))
                 and m_new and m.group(1) == m_new.group(1)), None)
same = (m_new is not None and old_loss is not None
        and abs(float(m_new.group(2)) - old_loss) <= 1e-5 * max(abs(old_loss), 1e-30))
f1 = lambda v: f"{v:.1f}"
f2 = lambda v: f"{v:.2f}"
row = dict(
    model=model, scen=scen, worlds=" -> ".join(worlds), at=it, resumed_from=frm,
    lost=f"{lost_it} it, {lost_s:.1f} s", mttr=f1(t1 - t0), notice=f1(notice),
    worker=f1(num(r"resumed ([\d.]+) s after", resumed)),
    agent=f1(num(r"after [^:]*: ([\d.]+) s until", resumed)),
    startup=f1(num(r"([\d.]+) s start-up and resume", resumed)),
    first_it=f1(num(r"([\d.]+) s for iteration", resumed)),
    steady=f2(statistics.median(steady) / 1e3) if steady else "nan",
    ck_mib=f"{num(r'[(]([0-9.]+) MiB in', saved):.0f}",
    blocked=f2(num(r"training blocked ([\d.]+) ms", saved) / 1e3),
    commit=f2(num(r"committed ([\d.]+) ms", saved) / 1e3),
    load=f2(num(r"in ([\d.]+) ms [(]", loaded) / 1e3),
    wall=wall,
    same_loss=("yes" if same else "NO") + f" ({m_new.group(2) if m_new else '?'} vs {old_loss})")
print("\t".join(str(v) for v in row.values()))
for name, x in (("attempt", att), ("resumed", resumed)):
    print(f"#{model}/{scen} {name}: {x}", file=sys.stderr)
PY
}

IFS=, read -ra model_list <<<"$models"
IFS=, read -ra scen_list <<<"$scenarios"
echo "# elastic MTTR: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -n); tp $tp, global batch 4," \
     "micro-batch 1, models $models, --save-interval $save_every, act $kill_after iterations after a committed save"
for m in "${model_list[@]}"; do
  for s in "${scen_list[@]}"; do
    if ((SECONDS >= end_at - 30)); then
      printf '%s\t%s\tSKIPPED: --limit %s s reached\n' "$m" "$s" "$limit" >>"$tmp/rows.tsv"; continue
    fi
    run_case "$m" "$s"
  done
done
"$py" - "$tmp/rows.tsv" <<'PY'
import sys
head = ["model", "fault", "world", "killed after it", "resumed from", "lost (worker's line)", "MTTR (script clock) s",
        "end noticed s", "worker: total s", "agents+rdzv s", "start-up+resume s", "first iteration s",
        "steady iteration s", "checkpoint MiB", "save blocked s", "save committed s", "load s", "case wall s", "loss after = attempt 1's"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for l in open(sys.argv[1]):
    f = l.rstrip("\n").split("\t")
    print("| " + " | ".join(f) + " |" if len(f) == len(head) else f"| {f[0]} | {f[1]} | {f[2]} |")
PY
echo
echo "MTTR: kill (node: the script's SIGKILL; fault: the worker's death seen by its wrapper) to the first"
echo "iteration line of the new attempt on this script's clock. end noticed: the first rank's record of the"
echo "attempt's end (ck/elastic/interrupted.N.json) after the kill. worker: rank 0's 'elastic: training"
echo "resumed' line, measured from that record: agents noticing + stopping + rendezvous, start-up (process"
echo "start to the first iteration's start: model init, Gloo, checkpoint load), the first iteration."
echo "loss after = attempt 1's: the first iteration after the restart logs the loss that iteration had before"
echo "the fault (1e-5 relative); a NO (or a failed case) makes this script exit 1."
if grep -qP '\tNO \(|\tFAILED: ' "$tmp/rows.tsv"; then exit 1; fi
