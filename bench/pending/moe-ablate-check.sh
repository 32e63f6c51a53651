#!/usr/bin/env bash
# Times only (wrong results): the merged-tile persistent FP8 experts (W kernels) with parts of
# their work switched off at compile time (bench/pending/moe-ablate.patch: DSV4_MOE_ABLATE bits
# 1 fold, 2 codes' copies, 4 consumers' wgmma + promotion, 8 weights' copies), against main's
# bench_linear. Before: apply the patch, BUILD=/tmp/lb ninja bench_linear, strip it as
# bench_linear_abl into .prebuilt3/abl.txz (xz); main's bench_linear_main in .prebuilt2/main.txz
# (step35-combined-check.sh's header); carry [".prebuilt2", ".prebuilt3"] (~60 s).
set -u
mkdir -p /tmp/m; tar -xJf .prebuilt2/main.txz -C /tmp/m; tar -xJf .prebuilt3/abl.txz -C /tmp/m
run() { BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 60 "$@" moe 2>&1 | grep -E 'fast packed' | tr -s ' ' | cut -c27-100 | tr '\n' ' '; }
for i in 1 2; do
  echo "main: $(run /tmp/m/bench_linear_main)"
  for n in 0 1 2 4 5 9 15; do echo "abl $n: $(DSV4_MOE_ABLATE=$n run /tmp/m/bench_linear_abl)"; done
done
