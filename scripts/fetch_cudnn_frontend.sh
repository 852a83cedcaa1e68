#!/usr/bin/env bash
# Installs the cuDNN frontend's header-only C++ API (cudnn_frontend.h and friends) into
# .deps/cudnn-frontend/include, where CMake looks by default (TRIAX_CUDNN_FRONTEND_INCLUDE_DIR).
# The headers ship in the nvidia-cudnn-frontend wheel on PyPI (under include/); only that
# directory is kept. Idempotent: a tree that already holds the pinned version is left as it is.
#
# Usage: scripts/fetch_cudnn_frontend.sh [--wheel FILE.whl] [--dest DIR]
#   --wheel  unpack this wheel instead of downloading (a machine without PyPI: copy the wheel,
#            or better the resulting .deps/cudnn-frontend directory, from one that has it)
#   --dest   install directory (default: <repo>/.deps/cudnn-frontend)
# Exit 0 with the headers in place, 1 otherwise (the build then goes on without the fast path).
set -euo pipefail
version=1.32.0  # the pinned frontend; cuDNN 9.x at run time (docs/CUDA.md)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=$here/.deps/cudnn-frontend
wheel=""
while (($#)); do
  case $1 in
    --wheel) wheel=$2; shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    *) echo "fetch_cudnn_frontend: unknown argument '$1' (usage: [--wheel FILE.whl] [--dest DIR])" >&2; exit 1 ;;
  esac
done

stamp=$dest/VERSION
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && [ -f "$dest/include/cudnn_frontend.h" ]; then
  echo "fetch_cudnn_frontend: $dest already holds cudnn-frontend $version"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$wheel" ]; then
  # Any wheel of the version carries the same headers: this Python's first, then a fixed
  # Linux x86-64 CPython 3.11 one (for a Python PyPI has no wheel for).
  if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cudnn-frontend==$version" 2>"$tmp/pip.err" &&
     ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
         --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version" 2>>"$tmp/pip.err"; then
    echo "fetch_cudnn_frontend: could not download nvidia-cudnn-frontend==$version from PyPI:" >&2
    tail -n 3 "$tmp/pip.err" >&2
    exit 1
  fi
  wheel=$(ls "$tmp"/nvidia_cudnn_frontend-*.whl | head -n1)
fi
[ -f "$wheel" ] || { echo "fetch_cudnn_frontend: no wheel at '$wheel'" >&2; exit 1; }

# Unpack only include/ (a wheel is a zip; Python's zipfile needs no unzip binary).
python3 - "$wheel" "$tmp/unpacked" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/") and not m.endswith("/")]
    if not any(m == "include/cudnn_frontend.h" for m in members):
        sys.exit(f"fetch_cudnn_frontend: {wheel} has no include/cudnn_frontend.h")
    for m in members:
        z.extract(m, out)
EOF
got=$(sed -n 's/^#define CUDNN_FRONTEND_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' \
        "$tmp/unpacked/include/cudnn_frontend_version.h" | paste -sd.)
if [ "$got" != "$version" ]; then
  echo "fetch_cudnn_frontend: $wheel holds frontend '$got', expected $version" >&2
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
mv "$tmp/unpacked/include" "$dest/include"
echo "$version" >"$stamp"
echo "fetch_cudnn_frontend: cudnn-frontend $version headers in $dest/include"
