#!/usr/bin/env bash
# Device check of the pending patches together (step 34): indexer-short-select.patch +
# indexer-warp-select.patch (one warp a row for rows of <= 2048 entries, top-k <= 512),
# moe-merged-tiles.patch, hc-post-project-64rows.patch. They apply together on main.
# Before: main's dsv4 and bench_ops stripped into .prebuilt2/main.txz (as main_{dsv4,bench_ops});
# the four patches applied, `dsv4 bench_ops bench_linear cuda_ops_indexer_test cuda_moe_test
# cuda_model_test cuda_ops_mhc_test` built, stripped into .prebuilt/p.txz; this file copied to
# .prebuilt/; run with carry [".prebuilt", ".prebuilt2"] (~480 s: tests and op benches first).
# A/B inside the new binary: DSV4_INDEXER_WARP_SELECT=0 (the 256-thread block select of
# indexer-short-select), DSV4_MOE_MERGE=0 (128-token tiles), DSV4_HC_POST_ROWS=32 (one row a
# thread); main's bench_ops gives the 1024-thread block select.
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
nvidia-smi --query-gpu=name --format=csv,noheader
for t in cuda_ops_indexer_test cuda_ops_mhc_test; do
  timeout 120 $B/$t > $OUT/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/$t.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/$t.log | head -6
done
timeout 300 $B/cuda_moe_test --gtest_filter='*Persistent*:*BySize*' > $OUT/moe-p.log 2>&1
echo "moe persistent rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe-p.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure|[1-9][0-9]* of [0-9]* differ" $OUT/moe-p.log | head -8
for i in 1 2; do for v in main block warp; do
  b=$B/bench_ops; [ $v = main ] && b=/tmp/m/bench_ops_main; w=1; [ $v = block ] && w=0
  DSV4_INDEXER_WARP_SELECT=$w BENCH_OPS_ROWS=8192 BENCH_INDEXER_ENTRIES=2048 BENCH_INDEXER_SPLIT=1 BENCH_INDEXER_CAUSAL=1 timeout 60 $b indexer 2>&1 |
    grep -E "bf16|select" | grep -v exact | cut -c1-110 | sed "s|^|$v causal |"
done; done
for v in main 32 64; do
  b=$B/bench_ops; [ $v = main ] && b=/tmp/m/bench_ops_main
  DSV4_HC_POST_ROWS=$v BENCH_OPS_ROWS=8192 timeout 60 $b hc 2>&1 | grep -iE "post|pair" | cut -c1-100 | sed "s|^|hc $v |"
done
for i in 1 2; do for m in 1 0; do
  DSV4_MOE_MERGE=$m BENCH_MOE_TOKENS=8192 BENCH_MOE_VARIANT=persistent timeout 100 $B/bench_linear moe 2>&1 | grep 'moe fp4' | grep -v persistent |
    cut -c1-100 | sed "s|^|merge=$m |"
done; done
e2e() { timeout 60 "$@" bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill|^1 ' | cut -c1-46 | tr '\n' '|'; }
for i in 1 2; do echo "main: $(e2e /tmp/m/dsv4_main)"; echo "new: $(e2e $B/dsv4)"; done
echo "new merge0: $(DSV4_MOE_MERGE=0 e2e $B/dsv4)"
echo "new rows32: $(DSV4_HC_POST_ROWS=32 e2e $B/dsv4)"
echo "new warp0: $(DSV4_INDEXER_WARP_SELECT=0 e2e $B/dsv4)"
timeout 150 $B/cuda_model_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/model.log | head -6
timeout 150 compute-sanitizer --tool memcheck $B/cuda_moe_test --gtest_filter='*Persistent*' > $OUT/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log)"
timeout 60 compute-sanitizer --tool memcheck $B/cuda_ops_indexer_test --gtest_filter='*WarpSelect*:*PrefillRows*' > $OUT/memcheck-idx.log 2>&1
echo "memcheck indexer rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck-idx.log)"
