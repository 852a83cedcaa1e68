#!/usr/bin/env bash
# Checkpoint save cost, measured in one run: how long the training loop is blocked by a save
# (copying the state to host memory) vs how long the background write takes, and the write rate
# vs `dd` (with fsync) to the same directory, dd before and after the saves (the disk drifts).
#
#   benchmarks/checkpoint_bench.sh [BUILD_DIR] [DIR] [NP] [extra train_gpt flags...]
#   benchmarks/checkpoint_bench.sh build /tmp/ckbench 2 --model gpt2-124m --tp 2
#
# Prints the "saved checkpoint" lines of train_gpt, then a small table. Nothing asserted.
set -euo pipefail
BUILD=${1:-build}; DIR=${2:-/tmp/ckbench}; NP=${3:-2}; shift 3 || true
extra=("$@"); [ ${#extra[@]} -gt 0 ] || extra=(--model gpt2-124m --tp 2)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
rm -rf "$DIR"; mkdir -p "$DIR"
dd_rate() {  # MB/s of a 1 GiB fsync'ed write into DIR
  dd if=/dev/zero of="$DIR/dd.bin" bs=4M count=256 conv=fsync 2>&1 | grep -o '[0-9.]* [MG]B/s' | tail -n 1
  rm -f "$DIR/dd.bin"
}
before=$(dd_rate)
mpirun -np "$NP" --oversubscribe "$BUILD/examples/train_gpt/train_gpt" "${extra[@]}" --seq-length 32 --micro-batch-size 1 \
  --train-iters 3 --save "$DIR/ck" --save-interval 1 --keep-last 1 >"$DIR/train.log" 2>&1
after=$(dd_rate)
grep "saved checkpoint" "$DIR/train.log"
echo
echo "| save | state (MiB, all ranks) | loop blocked (ms) | of it: previous save (ms) | of it: host copy (ms) | rank 0 shard (MiB) | rank 0 write+fsync (ms) | rank 0 rate (MiB/s) | commit after (ms) |"
echo "|---|---|---|---|---|---|---|---|---|"
n='\([0-9.]*\)'
sed -n "s/.*saved checkpoint \([^ ]*\) ($n MiB in [0-9]* files): training blocked $n ms ($n ms waiting for the previous save, $n ms host copy), rank 0 wrote $n MiB in $n ms ($n MiB\/s), committed $n ms.*/| \1 | \2 | \3 | \4 | \5 | \6 | \7 | \8 | \9 |/p" "$DIR/train.log"
echo
echo "dd (bs 4M, 1 GiB, conv=fsync) to $DIR: before $before, after $after"
grep "elapsed time per iteration" "$DIR/train.log" | sed 's/.*iteration *\([0-9]*\)\/.*elapsed time per iteration (ms): \([0-9.]*\).*/iteration \1: \2 ms/'
