#!/usr/bin/env bash
# Configure, build and run every test (CPU). GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"
# CUDA sources compile wherever nvcc exists (GPU tests then skip themselves without a GPU).
NVCC="$(command -v nvcc || true)"
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
CUDA_ARGS=()
[[ -n "$NVCC" && "${DSV4_NO_CUDA:-0}" != 1 ]] && CUDA_ARGS=(-DDSV4_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC")
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${CUDA_ARGS[@]}" ${CMAKE_ARGS:-}
cmake --build "$BUILD" -j"$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" --timeout 900
