#!/usr/bin/env bash
# The lean build of README command 1 (scripts/setup.sh without --tests): configured with no test and
# no benchmark target and with Catch2 made unfindable, it must configure, hold only the library and
# the example programs, build within BOUND seconds and train.
# Usage: lean_build_test.sh SOURCE_DIR BUILD_DIR BOUND_S NUM_EXAMPLES [cmake args...]
set -euo pipefail
src=$1; build=$2; bound=$3; num_examples=$4; shift 4
# A sibling of the build directory when it can be made: the same relative paths to the sources, so
# a compiler cache (ccache with a base directory) serves the compiles the full build already made.
tmp=$(mktemp -d "${build%/}-lean.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "lean build test: $*" >&2; exit 1; }

# CMAKE_DISABLE_FIND_PACKAGE_Catch2: a find_package(Catch2 REQUIRED) anywhere in the lean
# configuration is an error, as on a machine without the catch2 package.
cmake -S "$src" -B "$tmp" -G Ninja -DTRIAX_BUILD_TESTS=OFF -DTRIAX_BUILD_BENCHMARKS=OFF \
  -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON "$@" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; fail "the lean configuration failed (does it need a test-only package?)"; }
if grep -qi 'catch2' "$tmp/build.ninja"; then
  fail "the lean build graph mentions Catch2: $(grep -io '[^ ]*catch2[^ ]*' "$tmp/build.ninja" | sort -u | head -3 | tr '\n' ' ')"
fi
# Every executable of the lean tree is an example program: no test_*, no benchmark.
mapfile -t exes < <(ninja -C "$tmp" -t targets all | sed -n 's/^\([^: ]*\): CXX_EXECUTABLE_LINKER.*/\1/p')
for e in "${exes[@]}"; do
  case "$e" in examples/*) ;; *) fail "the lean build has a non-example executable: $e" ;; esac
done
[ "${#exes[@]}" -eq "$num_examples" ] ||
  fail "the lean build has ${#exes[@]} executables, expected the $num_examples example programs: ${exes[*]}"

start=$(date +%s)
if ! timeout "$bound" cmake --build "$tmp" -j "${TRIAX_JOBS:-2}" >"$tmp/build.log" 2>&1; then
  tail -n 30 "$tmp/build.log" >&2
  fail "the lean build failed or took longer than $bound s"
fi
echo "lean build test: configured without Catch2 and built ${#exes[@]} example programs in $(( $(date +%s) - start )) s"
# The lean trainer trains: two iterations on one rank of the built-in generated dataset.
out=$("$tmp/examples/train_gpt/train_gpt" --train-iters 2 2>&1) || { echo "$out" >&2; fail "the lean train_gpt failed"; }
grep -Eq 'iteration +2/ *2 ' <<<"$out" || { echo "$out" >&2; fail "the lean train_gpt printed no iteration 2"; }
echo "lean build test: ok"
