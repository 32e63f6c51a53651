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
nvidia-smi --query-gpu=name --format=csv,noheader
bash bench/pending/moe-fold-pieces-first-check.sh
bash bench/pending/indexer-select-decode-sizes-check.sh
