#!/usr/bin/env bash
# Device check of bench/pending/hc-post-project-64rows.patch (step 33, compiled): the tiled
# projecting hc_post at 64 rows a block for F (and F2) alone (the attention's hc_post): a thread
# makes two rows' columns and a warp runs both 16-row groups against one fn fragment, so fn's
# 12 KB step tile (as many L2 bytes as the streams') is read once for 64 rows and twice the loads
# are in flight a thread. Routed rows (the MoE's hc_post) stay one row a thread (two rows' six
# routed loads spill). Slices by 64-row blocks in both forms: the same partials and streams bit
# for bit (new test TiledRowsPerThreadAgree); DSV4_HC_POST_ROWS=32 gives one row a thread.
# ptxas: the RP = 2 kernels 128 registers, 8 bytes of spills (bf16 streams), 56 (fp32).
# Before: build main's dsv4 and bench_ops, strip to /tmp/x/{dsv4,bench_ops}_main, tar -cJf
# .prebuilt2/main.txz -C /tmp/x .; git apply the patch; build dsv4 bench_ops cuda_ops_mhc_test
# cuda_model_test, strip into /tmp/y, tar -cJf .prebuilt/p.txz -C /tmp/y .; run with carry
# [".prebuilt", ".prebuilt2"] (~90 s + the start).
# Land if mhc and model pass and hc_post_project (bf16 streams, 8192 rows: 371 us in step 32) drops.
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 $B/cuda_ops_mhc_test > $OUT/mhc.log 2>&1
echo "mhc rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/mhc.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/mhc.log | head -6
for i in 1 2; do for v in main 32 64; do
  b=$B/bench_ops; [ $v = main ] && b=/tmp/m/bench_ops_main
  DSV4_HC_POST_ROWS=$v BENCH_OPS_ROWS=8192 timeout 60 $b hc 2>&1 | grep -iE "post|pair" | cut -c1-100 | sed "s|^|hc $v |"
done; done
for i in 1 2; do for b in /tmp/m/dsv4_main $B/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill' | cut -c1-46)"
done; done
timeout 150 $B/cuda_model_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')"
