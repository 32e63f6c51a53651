#!/usr/bin/env bash
# Step 36: the persistent FP8 experts with more blocks copied ahead of the fold (DSV4_MOE_AHEAD=3;
# W kernels build with 2) and the weights' tile blocks asked of L2 DSV4_MOE_WPF blocks past the
# copies (bench/pending/moe-ahead-prefetch.patch); and e2e decode with the 1024-thread select
# blocks forced (they beat the 256-thread ones the rule picks at 1024 entries, R < 256).
# Before: apply the patch, scripts/prebuild.sh bench_linear cuda_moe_test dsv4, recompress to
# .prebuilt/p.txz (xz); carry [".prebuilt"] (~200 s).
set -u
B=/tmp/b; mkdir -p $B; tar -xJf .prebuilt/p.txz -C $B
for env in "DSV4_MOE_AHEAD=0" "DSV4_MOE_AHEAD=3 DSV4_MOE_WPF=4"; do
  env $env timeout 120 $B/tests/cuda/cuda_moe_test > $OUT/moe.log 2>&1
  echo "moe [$env] rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe.log | tr '\n' ' ')"
done
run() { env "$@" BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 60 $B/bench/bench_linear moe 2>&1 | grep -E 'fast packed' | awk '{for(i=1;i<=NF;i++) if($i=="us"){printf "%s ", $(i-1); break}}'; }
best="0 0"; bt=1e9
for i in 1 2; do for v in "0 0" "3 0" "0 2" "0 4" "3 4"; do
  set -- $v; r=$(run DSV4_MOE_AHEAD=$1 DSV4_MOE_WPF=$2); echo "ahead=$1 wpf=$2: $r"
  t=$(echo $r | awk '{print $2}'); if [[ -n "$t" ]] && awk "BEGIN{exit !($t < $bt)}"; then bt=$t; best="$v"; fi
done; done
echo "best (8192 tokens): $best ($bt us)"
for i in 1 2; do for v in "0 0" "$best"; do
  set -- $v; echo "e2e ahead=$1 wpf=$2: $(DSV4_MOE_AHEAD=$1 DSV4_MOE_WPF=$2 timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^(prefill|1 )' | cut -c1-50 | tr '\n' ' ')"
done; done
for i in 1 2; do for f in auto 1024; do
  DSV4_INDEXER_SELECT=$f timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1,64 --prefill 512 > /tmp/e.log 2>&1
  echo "select $f: $(grep -E '^(1|64) ' /tmp/e.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
done; done
timeout 90 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 --profile > $OUT/profile.log 2>&1
echo "profile rc=$?"
