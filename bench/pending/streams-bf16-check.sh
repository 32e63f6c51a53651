#!/usr/bin/env bash
# Device: the mHC streams as bf16 past 4 rows (Fast): mhc + model tests, e2e A/B (DSV4_STREAMS_BF16=0).
# .prebuilt/p.tgz from: git apply bench/pending/streams-bf16.patch; scripts/prebuild.sh dsv4 cuda_ops_mhc_test cuda_model_test
set -u
B=/tmp/dsv4-build; mkdir -p $B; tar -xzf .prebuilt/p.tgz -C $B
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
for t in cuda_ops_mhc_test cuda_model_test; do
  timeout 150 $B/tests/cuda/$t > $R/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/$t.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $R/$t.log | head -6
done
grep -E "fast vs exact|pooled" $R/cuda_model_test.log | head -6 | cut -c1-150
for v in 0 1 0 1; do
  echo "bf16 streams=$v: $(DSV4_STREAMS_BF16=$v timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1,64,256 --prefill 8192 2>&1 | grep -E '^prefill|^(1|64|256) ' | cut -c1-46 | tr '\n' '|')"
done
tar -czf $OUT/s16.tgz -C $OUT r && rm -rf $R
