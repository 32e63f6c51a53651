#!/usr/bin/env bash
# Device check of bench/pending/shared-input-past-gemv.patch (step 30, compiled, not run): past the
# GEMV sizes, linears sharing an input quantise (FP8) or round (bf16) it once — wq_a / wkv, the
# shared expert's gate / up, the compressor's and the indexer's bf16 linears (3 in one call).
# Before: git apply bench/pending/shared-input-past-gemv.patch; scripts/prebuild.sh dsv4
# cuda_linear_test cuda_ops_attention_test cuda_model_test; copy this file to .prebuilt/; run it
# with carry [".prebuilt"] (~2.5 min). Land if linear (SharedInputMatchesSeparateRuns at 300 rows,
# SharedBf16InputMatchesSeparateRuns) and model pass and the e2e A/B (DSV4_SHARED_INPUT_GEMM) gains.
set -u
B=/tmp/dsv4-build; mkdir -p $B; tar -xzf .prebuilt/p.tgz -C $B
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
for t in cuda_linear_test cuda_ops_attention_test cuda_model_test; do
  timeout 200 $B/tests/cuda/$t > $R/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $R/$t.log | tr '\n' ' ')"; grep -E "FAILED  \]|Failure" $R/$t.log | head -8
done
for v in 0 1 0 1; do
  echo "shared=$v: $(DSV4_SHARED_INPUT_GEMM=$v timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^prefill|^1 ' | cut -c1-46 | tr '\n' '|')"
done
tar -czf $OUT/r3.tgz -C $OUT r && rm -rf $R
