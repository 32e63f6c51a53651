#!/usr/bin/env bash
# Device check of bench/pending/hc-bf16-pre-project.patch (step 29, compiled, not run): with bf16
# streams from 256 rows, plain hc_post + hc_pre projecting the bf16 streams itself (128-byte row
# pieces) instead of hc_post_project's tiled form. Before: git apply
# bench/pending/hc-bf16-pre-project.patch; scripts/prebuild.sh dsv4 cuda_ops_mhc_test
# cuda_model_test bench_ops; copy this file to .prebuilt/; run it with carry [".prebuilt"] (~2 min).
# Land (make DSV4_HC_BF16_PRE_PROJECT=1 the default) if mhc and model pass and the e2e A/B gains.
set -u
B=/tmp/dsv4-build; mkdir -p $B; tar -xzf .prebuilt/p.tgz -C $B
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
for t in cuda_ops_mhc_test cuda_model_test; do
  timeout 150 $B/tests/cuda/$t > $R/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/$t.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $R/$t.log | head -6
done
BENCH_OPS_ROWS=8192 timeout 120 $B/bench/bench_ops hc > $R/ops_hc.log 2>&1
grep -E "hc_post|bf16" $R/ops_hc.log | cut -c1-150
for v in 0 1 0 1; do
  echo "pre projects bf16=$v: $(DSV4_HC_BF16_PRE_PROJECT=$v timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1,64,256 --prefill 8192 2>&1 | grep -E '^prefill|^(1|64|256) ' | cut -c1-46 | tr '\n' '|')"
done
DSV4_HC_BF16_PRE_PROJECT=1 timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 --profile > $R/profile.log 2>&1
grep -E "hc_post|hc_pre|sum" $R/profile.log | head -6
tar -czf $OUT/hcpre.tgz -C $OUT r && rm -rf $R
