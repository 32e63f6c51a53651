#!/usr/bin/env bash
# Device check of bench/pending/hc-post-project-fn-ahead.patch (step 31, compiled, not run): the
# tiled projecting hc_post fetches fn's 12 KB step tile a step ahead instead of waiting on it in
# the step that uses it (same products, same bits; register spills 12 -> 0-4 bytes).
# Before: build main's dsv4 and bench_ops, strip them to .prebuilt2/{dsv4,bench_ops}_main (tar.gz
# them if the carry is tight); git apply the patch; scripts/prebuild.sh dsv4 bench_ops
# cuda_ops_mhc_test; copy this file to .prebuilt/; run with carry [".prebuilt", ".prebuilt2"]
# (~100 s). Land if mhc passes and hc_post_project (bf16 streams, 8192 rows: 421 us in step 29)
# and the e2e prefill gain. Predicted: 421 -> 340-380 us, prefill -0.6..1.3 ms.
set -u
B=/tmp/dsv4-build; mkdir -p $B; tar -xzf .prebuilt/p.tgz -C $B
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 $B/tests/cuda/cuda_ops_mhc_test > $OUT/mhc.log 2>&1
echo "mhc rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/mhc.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/mhc.log | head -6
for i in 1 2; do for b in .prebuilt2/bench_ops_main $B/bench/bench_ops; do
  BENCH_OPS_ROWS=8192 timeout 100 $b hc 2>&1 | grep -E "hc_post_project|hc_post \+ hc_pre" | cut -c1-120 | sed "s|^|$b |"
done; done
for i in 1 2 3; do for b in .prebuilt2/dsv4_main $B/tools/dsv4; do
  echo "$b: $(timeout 80 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-46)"
done; done
