#!/usr/bin/env bash
# Device check of bench/pending/indexer-short-select.patch (step 32, compiled, not run: the device
# was taken back mid-call): the short-row indexer select (every row under kLargeRow entries: a
# prefill's CSA rows) in 256-thread blocks where the padded picks fit 512 (top-512, rows <= 8192
# entries), and the picks sorted in registers two a thread (sort_desc_in_registers) instead of
# the shared-memory bitonic network (45 barrier stages of 1024 threads at P = 512), and one
# barrier-free gathering pass where the threshold's ties are all picks. Same picks by
# construction (unique composite keys). New test PrefillRowsShortSelects.
# Before: build main's dsv4 and bench_ops, strip them to /tmp/x/{dsv4,bench_ops}_main and tar -cJf
# .prebuilt2/main.txz -C /tmp/x .; git apply the patch; build dsv4 bench_ops cuda_ops_indexer_test
# cuda_model_test, strip into /tmp/y and tar -cJf .prebuilt/p.txz -C /tmp/y .; copy this file to
# .prebuilt/; run with carry [".prebuilt", ".prebuilt2"] (~100 s + the start).
# Land if indexer and model pass and the select drops: `indexer select` causal 774 us, full 875 us,
# `indexer_topk fast bf16` full rows 1831 us at 8192 rows x 2048 entries (step 32 run 5, H100).
# Predicted: select 774 -> 250-450 us, prefill 8192 -1..1.5 ms.
set -u
B=/tmp/dsv4-build; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 $B/cuda_ops_indexer_test > $OUT/indexer.log 2>&1
echo "indexer rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/indexer.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $OUT/indexer.log | head -6
for i in 1 2; do for b in /tmp/m/bench_ops_main $B/bench_ops; do
  BENCH_OPS_ROWS=8192 BENCH_INDEXER_ENTRIES=2048 BENCH_INDEXER_SPLIT=1 BENCH_INDEXER_CAUSAL=1 timeout 60 $b indexer 2>&1 |
    grep -E "bf16|select" | cut -c1-110 | sed "s|^|$(basename $b) causal |"
done; done
for i in 1 2; do for b in /tmp/m/dsv4_main $B/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill|^1 ' | cut -c1-46 | tr '\n' '|')"
done; done
timeout 120 $B/cuda_model_test > $OUT/model.log 2>&1
echo "model rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/model.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/model.log | head -6
