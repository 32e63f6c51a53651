#!/usr/bin/env bash
# Device check of the three pending patches together (step 33: built, never run — no machine came):
# indexer-short-select.patch, moe-merged-tiles.patch, hc-post-project-64rows.patch. They touch
# different files and apply together on main (1a918ea).
# Before: build main's dsv4 and bench_ops, strip to /tmp/x/{dsv4,bench_ops}_main, tar -cJf
# .prebuilt2/main.txz -C /tmp/x . (10 MB); git apply the three patches; build dsv4 bench_ops
# bench_linear cuda_ops_indexer_test cuda_moe_test cuda_model_test cuda_ops_mhc_test, strip into
# /tmp/y, tar -cJf .prebuilt/p.txz -C /tmp/y . (35 MB; carry 60 of 64 MiB with the tree); copy
# this file to .prebuilt/ and run it with carry [".prebuilt", ".prebuilt2"] (~450 s + the start;
# the order puts tests and op benches first, so a shorter limit still tells most).
# A/B inside the new binary: DSV4_MOE_MERGE=0 (128-token tiles), DSV4_HC_POST_ROWS=32 (one row a
# thread); the select has no switch, so it runs against main's bench_ops.
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
nvidia-smi --query-gpu=name --format=csv,noheader
for t in cuda_ops_indexer_test cuda_ops_mhc_test; do
  timeout 120 $B/$t > $OUT/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$t.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/$t.log | head -6
done
timeout 300 $B/cuda_moe_test --gtest_filter='*Persistent*:*BySize*' > $OUT/moe-p.log 2>&1
echo "moe persistent rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe-p.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure|[1-9][0-9]* of [0-9]* differ" $OUT/moe-p.log | head -8
for i in 1 2; do for b in /tmp/m/bench_ops_main $B/bench_ops; do
  BENCH_OPS_ROWS=8192 BENCH_INDEXER_ENTRIES=2048 BENCH_INDEXER_SPLIT=1 BENCH_INDEXER_CAUSAL=1 timeout 60 $b indexer 2>&1 |
    grep -E "bf16|select" | cut -c1-110 | sed "s|^|$(basename $b) causal |"
done; done
for i in 1; do for v in main 32 64; do
  b=$B/bench_ops; [ $v = main ] && b=/tmp/m/bench_ops_main
  DSV4_HC_POST_ROWS=$v BENCH_OPS_ROWS=8192 timeout 60 $b hc 2>&1 | grep -iE "post|pair" | cut -c1-100 | sed "s|^|hc $v |"
done; done
for i in 1 2; do for m in 1 0; do
  DSV4_MOE_MERGE=$m BENCH_MOE_TOKENS=8192 BENCH_MOE_VARIANT=persistent timeout 100 $B/bench_linear moe 2>&1 | grep 'moe fp4' | grep -v persistent |
    cut -c1-100 | sed "s|^|merge=$m |"
done; done
for i in 1 2; do for b in /tmp/m/dsv4_main $B/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill|^1 ' | cut -c1-46 | tr '\n' '|')"
done; done
echo "dsv4 merge0: $(DSV4_MOE_MERGE=0 timeout 60 $B/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-46)"
echo "dsv4 rows32: $(DSV4_HC_POST_ROWS=32 timeout 60 $B/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-46)"
timeout 150 $B/cuda_model_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/model.log | head -6
timeout 150 compute-sanitizer --tool memcheck $B/cuda_moe_test --gtest_filter='*Persistent*' > $OUT/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)"
