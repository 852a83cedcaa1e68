#!/usr/bin/env bash
# Sets up everything (the library's packages and what only tests and benchmarks need), builds
# every target and runs the whole test suite (ctest). Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$here/build}
"$here/scripts/setup.sh" --tests "$build"
cd "$build"
ctest --output-on-failure --timeout 900 -j "${TRIAX_TEST_JOBS:-2}"
