#!/usr/bin/env bash
# The function-length check passes on the tree, and on a synthetic tree fails on a long function
# (braces in strings, comments and lambdas do not end it early), passes once the function is listed
# with a reason, and fails on an entry without a reason or one that excuses nothing.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
check="$here/tests/house/check_function_length.py"
python3 "$check" --root "$here"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/plan"
{
  echo 'namespace triax::plan {'
  echo 'int short_one(int x) { return x + 1; }'
  echo 'double long_one(int n) {'
  echo '  const char* s = "}}} not the end {";  // } nor this'
  echo '  auto f = [&](int i) { return i * 2; };'
  echo '  double t = 0;'
  for i in $(seq 1 110); do echo "  t += f($i) * n;  /* } */"; done
  echo '  return t;'
  echo '}'
  echo '}  // namespace triax::plan'
} > "$tmp/src/plan/synthetic.cpp"
allow="$tmp/allow.txt"

expect() {  # want (pass|fail), expected output part
  local rc=0 out
  out=$(python3 "$check" --root "$tmp" --allow "$allow") || rc=$?
  if [ "$1" = pass ] && [ $rc -ne 0 ]; then echo "FAIL: expected a pass:"; echo "$out"; exit 1; fi
  if [ "$1" = fail ] && [ $rc -ne 1 ]; then echo "FAIL: expected a failure (rc 1), got rc $rc:"; echo "$out"; exit 1; fi
  grep -qF -- "$2" <<<"$out" || { echo "FAIL: output lacks '$2':"; echo "$out"; exit 1; }
}
: > "$allow"
expect fail "src/plan/synthetic.cpp:3: triax::plan::long_one is 116 lines (limit 100)"
printf '# comment\nsrc/plan/synthetic.cpp triax::plan::long_one  a table that reads best whole\n' > "$allow"
expect pass "(1 listed)"
printf 'src/plan/synthetic.cpp triax::plan::long_one\n' > "$allow"
expect fail "needs a file, a function and a reason"
printf 'src/plan/synthetic.cpp triax::plan::long_one  a table that reads best whole\nsrc/plan/synthetic.cpp triax::plan::short_one  was long once upon a time\n' > "$allow"
expect fail "triax::plan::short_one in src/plan/synthetic.cpp is no longer over 100 lines"
echo "function length test: ok"
