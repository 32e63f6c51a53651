#!/usr/bin/env bash
# Device check of bench/pending/moe-down-codes-tma.patch (step 32, measured neutral, kept): the
# persistent FP8 experts' down kernel takes its tile's codes as one 128 x 128 TMA box a block
# (tensor_map.{h,cu}: cuTensorMapEncodeTiled through the runtime; the box completes on the stage's
# full barrier by expect_tx), gate/up keeps the cp.async gather. Bitwise: moe 12/12, memcheck 0
# errors (run 4). Measured neutral on an H100 (bench/NOTES.md step 32, runs 3-4); worth re-running
# once the consumers' side of the block gets cheaper. Before: main's bench_linear stripped to
# /tmp/x/bench_linear_main, tar -cJf .prebuilt2/main.txz -C /tmp/x .; git apply the patch; build
# bench_linear cuda_moe_test, strip into /tmp/y, tar -cJf .prebuilt/p.txz -C /tmp/y .; copy this
# file to .prebuilt/; run with carry [".prebuilt", ".prebuilt2"] (~60 s).
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
timeout 200 $B/cuda_moe_test --gtest_filter='*Persistent*:*BySize*' > $OUT/moe-p.log 2>&1
echo "moe persistent rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe-p.log | tr '\n' ' ')"
for i in 1 2; do for b in /tmp/m/bench_linear_main $B/bench_linear; do
  BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 100 $b moe 2>&1 | grep 'moe fp4' | grep -v persistent |
    cut -c1-100 | sed "s|^|$(basename $b) |"
done; done
