#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then configures and builds examples/ as a
# separate CMake project with find_package(triax), as a user's trainer would, and runs one program.
set -euo pipefail
build=$1; examples=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/lib/cmake/triax/triaxConfig.cmake"
test -f "$tmp/prefix/include/triax/distributed/comm/comm.h"
cmake -S "$examples" -B "$tmp/ex" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/ex" -j "${TRIAX_JOBS:-2}"
"$tmp/ex/hello_grid/hello_grid" | grep -q "groups ok"
echo "install test: find_package(triax) build and run ok"
