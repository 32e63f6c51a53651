#!/usr/bin/env bash
# Step 35's two pending checks in one device call (~200 s): moe-fold-pieces-first.patch (A/B
# against main's binaries) and the select forms at decode sizes (indexer-select-decode-sizes-check.sh's
# measurement; decode does not run the patched kernels, so the patched dsv4 serves it).
# Before (here, ~5 min of builds; xz keeps the carry under its 64 MiB: ~24 + 16 MB + the tree):
#   rm -rf .prebuilt .prebuilt2; BUILD=/tmp/lb scripts/prebuild.sh bench_linear dsv4
#   mkdir -p /tmp/m .prebuilt2 && tar -xzf .prebuilt/p.tgz -C /tmp/m && mv /tmp/m/bench/bench_linear /tmp/m/bench_linear_main \
#     && mv /tmp/m/tools/dsv4 /tmp/m/dsv4_main && tar -cJf .prebuilt2/main.txz -C /tmp/m bench_linear_main dsv4_main
#   git apply bench/pending/moe-fold-pieces-first.patch
#   BUILD=/tmp/lb scripts/prebuild.sh bench_linear cuda_moe_test dsv4 bench_ops
#   gunzip -c .prebuilt/p.tgz | xz -T2 > .prebuilt/p.txz && rm .prebuilt/p.tgz
# then run this with carry [".prebuilt", ".prebuilt2"]. Land the patch if moe passes and the
# 8192-token experts drop (main 5963-6005 us in step 35); widen the select rule as the decode
# check's header says.
set -u
B=/tmp/b; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 $B/tests/cuda/cuda_moe_test > $OUT/moe.log 2>&1
echo "moe rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/moe.log | head -6
for i in 1 2 3; do for b in /tmp/m/bench_linear_main $B/bench/bench_linear; do
  echo "$(basename $b): $(BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 60 $b moe 2>&1 | grep -E 'fast packed' | tr -s ' ' | cut -c27-100 | tr '\n' ' ')"
done; done
for i in 1 2; do for b in /tmp/m/dsv4_main $B/tools/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-50)"
done; done
for n in 1024 512; do for R in 1 8 64 256; do
  line="select n=$n R=$R"
  for f in warp 256 1024; do line="$line $f $(DSV4_INDEXER_SELECT=$f BENCH_OPS_ROWS=$R BENCH_INDEXER_ENTRIES=$n BENCH_INDEXER_SPLIT=1 timeout 30 $B/bench/bench_ops indexer 2>&1 | grep -E 'select' | awk '{for(i=1;i<=NF;i++) if($i=="us"){print $(i-1); exit}}')"; done
  echo "$line"
done; done
for i in 1 2 3; do for f in auto warp; do
  DSV4_INDEXER_SELECT=$f timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1,64 --prefill 512 > /tmp/e.log 2>&1
  echo "decode select $f: $(grep -E '^(1|64) ' /tmp/e.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
done; done
