#!/usr/bin/env bash
# A real one-node Slurm (Debian's slurm-wlm 22.05 + munge), started and stopped by this test with
# its own munge key and socket, state, spool and log directories and ports (no systemd, no
# cgroups: proctrack/linuxproc, task/none). Then:
#   1. scontrol's expansion of Slurm host lists equals triax's;
#   2. `srun -O -n 4` (no MPI) tasks find each other through the Slurm bootstrap (SLURM_PROCID,
#      SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST -> TCP rendezvous on the first node);
#   3. `srun --mpi=pmix -n 4 train_gpt --tp 2 --dp 2` trains and matches mpirun's losses, and so
#      does `srun --mpi=none` (the Gloo host communicator, no MPI);
#   4. clusters/slurm/train_gpt.sbatch runs through sbatch.
#   slurm_test.sh TRAIN_GPT BOOTSTRAP_CHECK MPIEXEC SOURCE_DIR
set -uo pipefail
train=$1; check=$2; mpiexec=$3; src=$4
for t in munged slurmctld slurmd srun sbatch scontrol sinfo; do
  command -v $t >/dev/null || { echo "SKIP: $t not installed (Debian packages slurm-wlm, munge)"; exit 77; }
done
tmp=$(mktemp -d /tmp/triax-slurm.XXXXXX); chmod 755 "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/log/*.log; do echo "== $f"; tail -15 "$f"; done; exit 1; }
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/log"
read -r ctld_port slurmd_port rdv_port < <(python3 "$src/tests/cluster/free_ports.py" 3)

dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$tmp/munge/munge.key"
munged --force --foreground --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/munge.socket" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/log/munged.log" --seed-file="$tmp/munge/seed" &
pids+=($!)
cpus=$(getconf _NPROCESSORS_ONLN)
cat >"$tmp/slurm.conf" <<CONF
ClusterName=triaxtest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
InactiveLimit=0
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=60 State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$tmp/slurm.conf"
for _ in $(seq 50); do [ -S "$tmp/munge/munge.socket" ] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >"$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
state=
for _ in $(seq 100); do
  state=$(timeout 5 sinfo -h -o %T 2>/dev/null | head -1)
  [ "$state" = idle ] && break
  sleep 0.3
done
[ "$state" = idle ] || fail "the node did not become idle (state '$state')"
echo "ok: slurmctld and slurmd up, node idle"

# 1. host lists: scontrol against triax.
for list in 'localhost' 'gpu[098-101]' 'n[1-2,5],login1' 'rack[1-2]-n[01-02]' 'rack[1-2]n[1-2]' 'node[0-3],x[7]' \
    'n[01-3]' 'n[1-02]' 'n[9-10]'; do
  want=$(scontrol show hostnames "$list") || fail "scontrol show hostnames $list"
  got=$("$check" hostlist "$list") || fail "bootstrap_check hostlist $list"
  [ "$want" = "$got" ] || fail "host list '$list': scontrol gives $(echo $want) but triax $(echo $got)"
done
# Lists Slurm refuses, triax refuses too.
for list in 'a[1-2]-ib' 'n[3-1]'; do
  # scontrol exits 0 either way; it says "Invalid hostlist".
  scontrol show hostnames "$list" 2>&1 | grep -q "Invalid hostlist" || fail "scontrol accepted '$list'"
  "$check" hostlist "$list" >/dev/null 2>&1 && fail "triax accepted '$list', which Slurm refuses"
done
echo "ok: host lists expand as scontrol's"

# 2. srun without MPI: the Slurm bootstrap's TCP rendezvous.
out=$(TRIAX_MASTER_PORT=$rdv_port timeout 120 srun -O -n 4 --mpi=none "$check" 2>&1) || fail "srun -n 4 bootstrap_check: $out"
echo "$out"
grep -q "launch slurm world 4" <<<"$out" || fail "not bootstrapped as a Slurm step of 4: $out"
[ "$(grep -c '^rank ' <<<"$out")" -eq 4 ] || fail "not 4 ranks: $out"
for l in 0 1 2 3; do grep -q "^rank [0-3] .* $l$" <<<"$out" || fail "no task with SLURM_LOCALID $l: $out"; done
# Without TRIAX_MASTER_PORT the port comes from the job and step ids, the same in every task.
out=$(timeout 120 srun -O -n 2 --mpi=none "$check" 2>&1) || fail "srun -n 2 with a derived port: $out"
grep -q "launch slurm world 2" <<<"$out" || fail "derived port: $out"
echo "ok: srun tasks rendezvous through the Slurm bootstrap"

# 3. srun --mpi=pmix: Open MPI under Slurm trains like mpirun.
args=(--tp 2 --dp 2 --train-iters 4 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32)
if srun --mpi=list 2>&1 | grep -q pmix; then
  timeout 300 srun -O -n 4 --mpi=pmix "$train" "${args[@]}" >"$tmp/srun.out" 2>&1 || { cat "$tmp/srun.out"; fail "srun --mpi=pmix train_gpt"; }
  (unset SLURM_CONF; env -u SLURM_JOB_ID timeout 300 "$mpiexec" --oversubscribe -np 4 "$train" "${args[@]}" >"$tmp/mpirun.out" 2>&1) \
    || { cat "$tmp/mpirun.out"; fail "mpirun train_gpt"; }
  s=$(grep -o 'lm loss: [0-9.E+-]*' "$tmp/srun.out"); m=$(grep -o 'lm loss: [0-9.E+-]*' "$tmp/mpirun.out")
  [ "$(wc -l <<<"$s")" -eq 4 ] || fail "srun run printed $(wc -l <<<"$s") losses"
  [ "$s" = "$m" ] || fail "losses differ: srun $(echo $s) mpirun $(echo $m)"
  echo "ok: srun --mpi=pmix train_gpt --tp 2 --dp 2 matches mpirun: $(echo $s | tr '\n' ' ')"
else
  fail "this Slurm has no pmix plugin (srun --mpi=list)"
fi

# 3b. srun --mpi=none: no MPI at all; the host communicator is Gloo over the Slurm bootstrap.
timeout 300 srun -O -n 4 --mpi=none "$train" "${args[@]}" >"$tmp/srun_gloo.out" 2>&1 \
  || { cat "$tmp/srun_gloo.out"; fail "srun --mpi=none train_gpt"; }
g=$(grep -o 'lm loss: [0-9.E+-]*' "$tmp/srun_gloo.out")
[ "$g" = "$m" ] || fail "losses differ: srun --mpi=none (Gloo) $(echo $g) mpirun $(echo $m)"
echo "ok: srun --mpi=none train_gpt --tp 2 --dp 2 (Gloo) matches mpirun"

# 4. The shipped sbatch script.
jobid=$(TRAIN_GPT="$train" TRIAX_TRAIN_ARGS="${args[*]}" sbatch --parsable -o "$tmp/sbatch.out" -n 4 -O --time=00:10:00 \
  "$src/clusters/slurm/train_gpt.sbatch") || fail "sbatch"
for _ in $(seq 300); do
  st=$(scontrol show job "$jobid" 2>/dev/null | grep -o 'JobState=[A-Z]*' | cut -d= -f2)
  case $st in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 0.5
done
[ "$st" = COMPLETED ] || { cat "$tmp/sbatch.out"; fail "sbatch job $jobid ended $st"; }
b=$(grep -o 'lm loss: [0-9.E+-]*' "$tmp/sbatch.out")
[ "$b" = "$m" ] || { cat "$tmp/sbatch.out"; fail "sbatch losses differ: $(echo $b)"; }
echo "ok: clusters/slurm/train_gpt.sbatch trained with the same losses"
