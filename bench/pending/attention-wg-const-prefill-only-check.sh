#!/usr/bin/env bash
# Device check of bench/pending/attention-wg-const-prefill-only.patch (step 31, compiled, not run):
# the warpgroup-constant wgmma issue only where one split takes a row; the decode splits back on the
# runtime-wg form (run 8 saw b1 +10 us after the change). Before: build main's dsv4 and strip it to
# .prebuilt/dsv4_main; git apply the patch; scripts/prebuild.sh dsv4 cuda_ops_attention_test
# (its p.tgz into .prebuilt too); copy this file to .prebuilt/; run with carry [".prebuilt"] (~90 s).
# Land if attention passes and b1 returns to ~1.75-1.76 ms with the prefill unchanged.
set -u
B=/tmp/dsv4-build; mkdir -p $B; tar -xzf .prebuilt/p.tgz -C $B
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 $B/tests/cuda/cuda_ops_attention_test > $OUT/attn.log 2>&1
echo "attention rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/attn.log | tr '\n' ' ')"
for i in 1 2 3; do for b in .prebuilt/dsv4_main $B/tools/dsv4; do
  echo "$b: $(timeout 80 $b bench --preset v4-flash --layers 8 --random-weights --batches 1,64 --prefill 8192 2>&1 | grep -E '^prefill|^1 |^64 ' | cut -c1-46 | tr '\n' '|')"
done; done
echo "always wg-const: $(DSV4_ATTN_WG_CONST=1 timeout 80 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 64 2>&1 | grep -E '^1 ' | cut -c1-46)"
