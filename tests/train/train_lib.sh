# Shell helpers of the train_gpt script tests (sourced after the script defines fail() and run()):
#   expect_exit CODE PATTERN ARGS...: `run ARGS` exits CODE, PATTERN on exactly one line of the output
#     (one message per job, whatever the rank count), no hang and no Open MPI error-log noise.
#   compare_losses REF GOT: two --metrics-jsonl files of 3 iterations, every loss and grad norm
#     within 1e-5 relative, and the reference learned.
expect_exit() {
  local code=$1 pattern=$2; shift 2
  local out rc n
  out=$(run "$@" 2>&1); rc=$?
  [ $rc -ne 124 ] || fail "timed out (a hang) for: $*"
  [ $rc -eq "$code" ] || { echo "$out" | tail -8; fail "exit $rc, expected $code for: $*"; }
  n=$(grep -cF -- "$pattern" <<<"$out")
  [ "$n" -eq 1 ] || { echo "$out" | tail -8; fail "'$pattern' printed $n times (expected once) for: $*"; }
  ! grep -q "ORTE_ERROR_LOG" <<<"$out" || { grep -n "ORTE_ERROR_LOG" <<<"$out"; fail "ORTE_ERROR_LOG noise for: $*"; }
  echo "ok: exit $code, one '$pattern' for: $*"
}

compare_losses() {
  python3 - "$1" "$2" <<'PY' || fail "losses differ from one process"
import json, sys
ref, got = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(ref) == len(got) == 3, (len(ref), len(got))
for a, b in zip(ref, got):
    for k in ("loss", "grad_norm"):
        assert abs(a[k] - b[k]) <= 1e-5 * abs(a[k]), (a["iteration"], k, a[k], b[k])
assert ref[-1]["loss"] < ref[0]["loss"], "the reference did not learn"
print("ok: losses", [round(r["loss"], 6) for r in got], "equal one process's")
PY
}
