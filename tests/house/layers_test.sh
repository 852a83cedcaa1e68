#!/usr/bin/env bash
# The layer check passes on the tree, and fails (naming file, line and both layers) on a copy of
# a minimal tree where a lower folder includes a higher one, a sibling, or an unplaced folder.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
check="$here/scripts/check_layers.py"
python3 "$check" --root "$here"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include/triax/core" "$tmp/include/triax/train" "$tmp/src/ops" "$tmp/src/io" "$tmp/kernels"
printf '#include "triax/core/error.h"\n' > "$tmp/include/triax/train/trainer.h"
printf '#include "triax/core/error.h"\n' > "$tmp/src/ops/gemm.cpp"
python3 "$check" --root "$tmp" >/dev/null || { echo "FAIL: a clean tree was refused"; exit 1; }

. "$here/tests/house/refuse.sh"  # expect_refused FILE TEXT NEEDLE
expect_refused include/triax/core/log.h '#include "triax/train/trainer.h"' \
  "include/triax/core/log.h:1: core (layer 0) includes a higher layer: train"
expect_refused src/ops/attention.cpp '  #  include "triax/io/safetensors.h"' \
  "src/ops/attention.cpp:1: ops (layer 1) includes a sibling layer: io"
expect_refused kernels/gelu.cu '#include "triax/model/gpt.h"' "kernels/gelu.cu:1: cuda (layer 4) includes a higher layer: model"
expect_refused src/io/x.cpp '#include "triax/nowhere/x.h"' "includes folder 'nowhere', which has no layer"
expect_refused src/newfolder/x.cpp '#include "triax/core/error.h"' "folder 'newfolder' has no layer"
echo "layers test: ok"
