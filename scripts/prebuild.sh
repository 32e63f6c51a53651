#!/usr/bin/env bash
# Builds CUDA targets on this (GPU-less) machine and packs them for the device machine, whose
# minutes are scarce: `scripts/prebuild.sh dsv4 bench_linear cuda_moe_test` writes
# .prebuilt/p.tgz (git-ignored) with each binary stripped at its build-tree path (tools/dsv4,
# bench/..., tests/cuda/...); then run `PREBUILT=.prebuilt/p.tgz scripts/gpu-check.sh MODE` on the
# device with carry [".prebuilt"] (gpu-check falls back to building if they do not run there).
# BUILD (default /tmp/lbuild) keeps the build tree between calls; the first configure needs the
# packages in .ci/run's list, ninja-build and nvcc at /usr/local/cuda/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
(($# > 0)) || { echo "usage: scripts/prebuild.sh TARGET..." >&2; exit 2; }
BUILD="${BUILD:-/tmp/lbuild}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DDSV4_CHAT=OFF \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc >/dev/null
fi
ninja -C "$BUILD" -j"$(nproc)" "$@"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
for t in "$@"; do
  path="$(cd "$BUILD" && find . -type f -name "$t" -perm -u+x -not -path "*/CMakeFiles/*" | head -1)"
  [[ -n "$path" ]] || { echo "prebuild: no binary named $t under $BUILD" >&2; exit 1; }
  mkdir -p "$stage/$(dirname "$path")"
  cp "$BUILD/$path" "$stage/$path"
  strip "$stage/$path"
done
mkdir -p .prebuilt
tar -czf .prebuilt/p.tgz -C "$stage" .
echo "prebuild: .prebuilt/p.tgz ($(du -h .prebuilt/p.tgz | cut -f1)): $(cd "$stage" && find . -type f | tr '\n' ' ')"
