#!/usr/bin/env bash
# indexer-warp-sort-rolled.patch (step 34, compiled, not run) on main: build cuda_ops_indexer_test bench_ops
# cuda_model_test with it applied, strip into .prebuilt/p.txz (step 34 left exactly those binaries
# there, built from main + this patch), run this with carry [".prebuilt"]. It
# must pass the indexer tests and memcheck, and take forced-warp R=1 e=2048 well under 46 us (the
# unrolled sort; 1024-thread blocks 26 us) with the causal 8192 select no slower than ~200 us.
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B ./cuda_ops_indexer_test ./bench_ops ./cuda_model_test
timeout 60 $B/cuda_ops_indexer_test > $OUT/idx.log 2>&1; echo "indexer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/idx.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/idx.log | head -6
for f in warp 1024; do echo "$f R=1 e=2048 $(DSV4_INDEXER_SELECT=$f BENCH_OPS_ROWS=1 BENCH_INDEXER_ENTRIES=2048 BENCH_INDEXER_SPLIT=1 timeout 30 $B/bench_ops indexer 2>&1 | grep -E 'select' | cut -c50-75)"; done
echo "auto causal 8192 $(BENCH_OPS_ROWS=8192 BENCH_INDEXER_ENTRIES=2048 BENCH_INDEXER_SPLIT=1 BENCH_INDEXER_CAUSAL=1 timeout 30 $B/bench_ops indexer 2>&1 | grep -E 'select' | cut -c50-75)"
timeout 60 compute-sanitizer --tool memcheck $B/cuda_ops_indexer_test --gtest_filter='*WarpSelect*' > $OUT/memcheck-idx.log 2>&1
echo "memcheck indexer rc=$? $(grep -E 'ERROR SUMMARY' $OUT/memcheck-idx.log)"
timeout 100 $B/cuda_model_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/model.log | head -6
