#!/usr/bin/env bash
# Device check of bench/pending/grouped-gemm-uniform-desc.patch (step 31, compiled, not run): the
# grouped FP8 GEMM (wo_a, 33-512 rows) issues its wgmmas with the warpgroup as a template constant
# (wg through a shuffle, so the branch is not a divergent path: no ptxas C7520), descriptors built
# once a block and advanced by uniform adds; same descriptors, same bits.
# Before: build main's bench_linear, strip it to .prebuilt2/bench_linear_main; git apply the patch;
# scripts/prebuild.sh bench_linear cuda_linear_test; copy this file to .prebuilt/; run with carry
# [".prebuilt", ".prebuilt2"] (~60 s). Land if linear passes and the grouped rows gain.
set -u
B=/tmp/dsv4-build; mkdir -p $B; tar -xzf .prebuilt/p.tgz -C $B
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/tests/cuda/cuda_linear_test > $OUT/linear.log 2>&1
echo "linear rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/linear.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/linear.log | head -6
for i in 1 2; do for b in .prebuilt2/bench_linear_main $B/bench/bench_linear; do
  timeout 100 $b linear 2>&1 | grep -iE "wo_a|group" | head -12 | cut -c1-120 | sed "s|^|$b |"
done; done
