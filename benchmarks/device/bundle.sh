#!/usr/bin/env bash
# Run HERE (the Debian build machine), in the repository that will be sent to the device: packs
# the build dependencies the H200 image lacks (fmt, OpenBLAS + libgfortran/libquadmath, Catch2,
# nlohmann-json, CLI11, toml++, OpenSSL's libcrypto with its headers (checkpoint SHA-256); NCCL's
# header as a fallback) from the installed Debian packages into <repo>/.deps/triax-deps.tar.xz (.gz without xz)
# (ignored by git; pass ".deps" in the device tool's carry). cpp-httplib is not packed: the
# device build is configured with -DTRIAX_WITH_HTTP=OFF (no /metrics endpoint).
# The tarball unpacks to usr/... (a relocatable prefix: the packages' CMake configs compute their
# prefix from their own location) plus nccl/include/nccl.h and a MANIFEST.
# With the default output directory it also runs scripts/fetch_cudnn_frontend.sh (the cuDNN
# frontend's headers into .deps/cudnn-frontend), so that this one command makes all of .deps/.
# Usage: benchmarks/device/bundle.sh [output-dir]    (default <repo>/.deps)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/.deps}
arch=x86_64-linux-gnu
lib=/usr/lib/$arch

need() { [ -e "$1" ] || { echo "bundle.sh: $1 is missing (install the Debian package that provides it)" >&2; exit 1; }; }
for f in /usr/include/fmt/format.h $lib/libfmt.so.9 $lib/cmake/fmt /usr/include/catch2/catch.hpp /usr/lib/cmake/Catch2 \
         /usr/include/nlohmann/json.hpp /usr/share/cmake/nlohmann_json /usr/include/CLI/CLI.hpp /usr/share/cmake/CLI11 \
         /usr/include/toml++/toml.h $lib/libtomlplusplus.so.3 $lib/cmake/tomlplusplus $lib/libopenblas.so.0 \
         $lib/libgfortran.so.5 $lib/libquadmath.so.0 \
         /usr/include/openssl/evp.h /usr/include/$arch/openssl/configuration.h $lib/libcrypto.so.3; do
  need "$f"
done

# cblas.h of whichever OpenBLAS development package is installed (pthread or openmp).
cblas_dir=$(ls -d /usr/include/$arch/openblas-pthread /usr/include/$arch/openblas-openmp 2>/dev/null | head -1 || true)
[ -n "$cblas_dir" ] && [ -f "$cblas_dir/cblas.h" ] ||
  { echo "bundle.sh: no /usr/include/$arch/openblas-{pthread,openmp}/cblas.h (install libopenblas-dev)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
p=$stage/usr
# Whole packages (headers, CMake configs, shared and static libraries the configs reference), as
# dpkg lists them, documentation left out.
pkgs="libfmt-dev libfmt9 catch2 nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libtomlplusplus3"
for pkg in $pkgs; do
  dpkg -L "$pkg" | grep -Ev '^/usr/share/(doc|man|lintian)/' | while read -r f; do
    if [ -f "$f" ] || [ -L "$f" ]; then mkdir -p "$stage$(dirname "$f")" && cp -a "$f" "$stage$f"; fi
  done
done
# OpenBLAS: the library libopenblas.so.0 resolves to here (Debian alternatives) and its cblas.h,
# plus the libraries it needs at run time that a CUDA image does not have. Not the 58 MB .a.
mkdir -p "$p/include/$arch" "$stage/nccl/include"
cp "$(readlink -f $lib/libopenblas.so.0)" "$p/lib/$arch/libopenblas.so.0"
ln -s libopenblas.so.0 "$p/lib/$arch/libopenblas.so"
mkdir -p "$p/include/openblas"
cp -a "$cblas_dir"/. "$p/include/openblas/"   # run_h200.sh: TRIAX_CBLAS_INCLUDE_DIR
cp -a $lib/libgfortran.so.5* $lib/libquadmath.so.0* "$p/lib/$arch/"
# OpenSSL (libssl-dev, libssl3): libcrypto and every header, the multiarch configuration headers
# moved beside the others so that one include directory serves (run_h200.sh: OPENSSL_INCLUDE_DIR).
cp -a /usr/include/openssl "$p/include/"
cp -a /usr/include/$arch/openssl/. "$p/include/openssl/"
cp "$(readlink -f $lib/libcrypto.so.3)" "$p/lib/$arch/libcrypto.so.3"
ln -s libcrypto.so.3 "$p/lib/$arch/libcrypto.so"
# NCCL's header, used only when the image's nvidia-nccl wheel has none (the library comes from it).
if [ -f /usr/local/cuda/include/nccl.h ]; then
  cp /usr/local/cuda/include/nccl.h "$stage/nccl/include/"
else
  echo "bundle.sh: warning: no /usr/local/cuda/include/nccl.h: the device run then needs the wheel's header" >&2
fi
{
  echo "# triax device dependencies, packed $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  dpkg-query -W -f='# ${Package} ${Version}\n' libfmt-dev libfmt9 catch2 nlohmann-json3-dev libcli11-dev \
    libtomlplusplus-dev libtomlplusplus3 libopenblas0-pthread libopenblas-pthread-dev libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libssl-dev libssl3 \
    2>/dev/null || true
  (cd "$stage" && find . \( -type f -o -type l \) ! -name MANIFEST | sort)
} > "$stage/MANIFEST"

mkdir -p "$out"
# xz (7.7 MB); gzip where xz-utils is not installed (a minimal CI image; about 40% larger).
if command -v xz >/dev/null; then ext=xz zip=(xz -T2 -6); else ext=gz zip=(gzip -6); fi
rm -f "$out"/triax-deps.tar.xz "$out"/triax-deps.tar.gz
tar -C "$stage" -cf - . | "${zip[@]}" > "$out/triax-deps.tar.$ext.tmp"
mv "$out/triax-deps.tar.$ext.tmp" "$out/triax-deps.tar.$ext"
echo "bundle.sh: $(du -h "$out/triax-deps.tar.$ext" | cut -f1) in $out/triax-deps.tar.$ext ($(du -sh "$stage" | cut -f1) unpacked, $(grep -vc '^#' "$stage/MANIFEST") files)"
# The cuDNN frontend's headers (the fused-attention fast path), where the build looks for them by
# default: <repo>/.deps/cudnn-frontend (scripts/fetch_cudnn_frontend.sh; carried with .deps).
# Only for the carried .deps; without them the device build runs the CUDA-core attention.
if [ "$(cd "$out" && pwd)" = "$root/.deps" ] && [ -x "$root/scripts/fetch_cudnn_frontend.sh" ]; then
  if "$root/scripts/fetch_cudnn_frontend.sh" >&2; then
    echo "bundle.sh: cuDNN frontend headers in $root/.deps/cudnn-frontend ($(du -sh "$root/.deps/cudnn-frontend" | cut -f1))" >&2
  else
    echo "bundle.sh: warning: scripts/fetch_cudnn_frontend.sh failed: the device build will have no cuDNN attention" >&2
  fi
fi
