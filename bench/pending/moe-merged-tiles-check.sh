#!/usr/bin/env bash
# Device check of bench/pending/moe-merged-tiles.patch (step 32, compiled, not run): the persistent
# FP8 prefill experts on merged tiles. group_pairs with a merge width of 192 makes an expert's last
# two 128-token tiles one tile where they hold at most 192 pairs (c in (128, 192] after its full
# tiles); the persistent kernels' wide instantiation (W: 4 stages + an extra ring of 64 tokens'
# codes and scales, setmaxnreg 136 / 184) runs such an item as an n128 and an n64 wgmma set on one
# folded A, so the weights are folded once for both (step 32 run 2: producers and consumers
# balanced at ~1700 cycles a block; a 64-token item cost a producer as much as a 128-token one).
# Same bits by construction: `Fp8WarpSpecialisedPersistentMatchesWide` now runs with merged tiles
# on and off (`set_moe_merge_tiles`, env DSV4_MOE_MERGE=0 for A/B); BySizePrefillTilesMatchWide
# covers the default. ptxas: the W kernels spill 32-100 bytes (the W = 0 ones none, as before).
# Before: build main's bench_linear and dsv4, strip to /tmp/x/{bench_linear,dsv4}_main, tar -cJf
# .prebuilt2/main.txz -C /tmp/x .; git apply the patch; build bench_linear dsv4 cuda_moe_test
# cuda_model_test, strip into /tmp/y, tar -cJf .prebuilt/p.txz -C /tmp/y .; copy this file to
# .prebuilt/; run with carry [".prebuilt", ".prebuilt2"] (~150 s + the start).
# Land if moe and model pass (and memcheck is clean) and 8192 tokens gains. Predicted: routed
# experts at 8192 tokens −15..25% (6200 -> ~4800-5300 us), prefill 8192 −7..12 ms; 4096 unchanged
# (experts average 96 tokens: no merges). If the 4-stage ring or the spills cost more than the fold
# saves, try merging only down (its consumers' epilogue is lighter) or 5 stages with a smaller A.
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 $B/cuda_moe_test --gtest_filter='*Persistent*:*BySize*' > $OUT/moe-p.log 2>&1
echo "moe persistent rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe-p.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure|[1-9][0-9]* of [0-9]* differ" $OUT/moe-p.log | head -8
for i in 1 2; do for b in /tmp/m/bench_linear_main $B/bench_linear; do
  BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 100 $b moe 2>&1 | grep 'moe fp4' | grep -v persistent |
    cut -c1-100 | sed "s|^|$(basename $b) |"
done; done
echo "merge off: $(DSV4_MOE_MERGE=0 BENCH_MOE_TOKENS=8192 BENCH_MOE_VARIANT=persistent timeout 100 $B/bench_linear moe 2>&1 | grep 'moe fp4' | grep -v persistent | cut -c1-100)"
for i in 1 2; do for b in /tmp/m/dsv4_main $B/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-46)"
done; done
timeout 200 compute-sanitizer --tool memcheck $B/cuda_moe_test --gtest_filter='*Persistent*' > $OUT/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)"
timeout 150 $B/cuda_model_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')"
