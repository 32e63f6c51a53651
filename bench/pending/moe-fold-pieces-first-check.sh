#!/usr/bin/env bash
# Device check of bench/pending/moe-fold-pieces-first.patch (step 35, compiled, not run): the FP8
# prefill experts' producers load a row's packed pieces together with its E8M0 word, ahead of the
# branch on the word, instead of after it (step 35's ncu: two short_sb stall points a block, at the
# word's first use and at the pieces'). Same loads, same bytes: the outputs cannot change.
# ptxas (W kernels): down's spills 32 / 60 -> 56 / 64 bytes, gate/up 100 / 20 -> 96 / 16 (+ 32 in
# the out-of-line rounded fold); the other kernels' counts unchanged.
# Before: as step35-combined-check.sh's header (which runs this check and the decode-size select
# measurement in one call); this script alone needs cuda_moe_test, bench_linear and dsv4 in
# .prebuilt/p.txz and main's bench_linear_main, dsv4_main in .prebuilt2/main.txz; carry
# [".prebuilt", ".prebuilt2"] (~120 s). Land if moe passes and 8192 tokens drops (main 5963-6005
# us, step 35).
set -u
B=/tmp/b; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
timeout 120 $B/tests/cuda/cuda_moe_test > $OUT/moe.log 2>&1
echo "moe rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/moe.log | head -6
for i in 1 2 3; do for b in /tmp/m/bench_linear_main $B/bench/bench_linear; do
  echo "$(basename $b): $(BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 60 $b moe 2>&1 | grep -E 'fast packed' | tr -s ' ' | cut -c27-100 | tr '\n' ' ')"
done; done
for i in 1 2; do for b in /tmp/m/dsv4_main $B/tools/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-50)"
done; done
