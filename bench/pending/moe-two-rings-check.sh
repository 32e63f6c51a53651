#!/usr/bin/env bash
# Device check of bench/pending/moe-two-rings.patch (step 36, compiled, not run): the persistent
# FP8 experts' copies and folded weights in two rings (5 raw entries, 3 folded; three blocks'
# copies ahead of the fold instead of two), with the knobs DSV4_MOE_AHEAD (1-3; 2 = the old
# depth on the new rings) and DSV4_MOE_WPF (weight tile blocks asked of L2 that many blocks past
# the copies). Outputs bitwise those of the wide kernels by construction (same operand bytes).
# Before (here, ~5 min of builds; xz keeps the carry near 46 MB):
#   BUILD=/tmp/lb ninja bench_linear dsv4 on main, stripped as bench_linear_main, dsv4_main in
#   .prebuilt2/main.txz; git apply bench/pending/moe-two-rings.patch; BUILD=/tmp/lb
#   scripts/prebuild.sh bench_linear cuda_moe_test dsv4; gunzip -c .prebuilt/p.tgz | xz > .prebuilt/p.txz
#   (and for the ablation part: moe-two-rings-ablate.patch instead, bench_linear stripped as
#   bench_linear_abl in .prebuilt3/abl.txz)
# then run this with carry [".prebuilt", ".prebuilt2", ".prebuilt3"] (~280 s, up to ~430 with the
# sanitizers, which run last). Land if moe passes, memcheck and racecheck are clean and 8192 tokens
# drops against main's binary (step 36: 5758-5846 us). It also times decode with the 1024-thread
# select blocks forced (form_by_size: widen their case if b1 / b64 drop).
set -u
B=/tmp/b; mkdir -p $B /tmp/m; tar -xJf .prebuilt/p.txz -C $B; tar -xJf .prebuilt2/main.txz -C /tmp/m
for env in "DSV4_MOE_AHEAD=0" "DSV4_MOE_AHEAD=1 DSV4_MOE_WPF=4" "DSV4_MOE_AHEAD=2"; do
  env $env timeout 150 $B/tests/cuda/cuda_moe_test > $OUT/moe.log 2>&1
  echo "moe [$env] rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/moe.log | tr '\n' ' ')"; grep -E "FAILED  \]" $OUT/moe.log | head -4
done
run() { env "$@" BENCH_MOE_TOKENS=4096,8192 BENCH_MOE_VARIANT=persistent timeout 60 "${BIN:-$B/bench/bench_linear}" moe 2>&1 | grep -E 'fast packed' | awk '{for(i=1;i<=NF;i++) if($i=="us"){printf "%s ", $(i-1); break}}'; }
for i in 1 2; do
  echo "main: $(BIN=/tmp/m/bench_linear_main run X=0)"
  for v in "0 0" "2 0" "0 2" "0 4"; do set -- $v; echo "two rings ahead=$1 wpf=$2: $(run DSV4_MOE_AHEAD=$1 DSV4_MOE_WPF=$2)"; done
done
# The two-ring kernels taken apart as step 36's ablation took main's (moe-two-rings-ablate.patch,
# .prebuilt3/abl.txz; bits 1 fold, 2 codes' copies, 4 wgmma + promotion off; 15 leaves the
# weights' copies and the barriers): what bounds them now.
if [[ -f .prebuilt3/abl.txz ]]; then
  tar -xJf .prebuilt3/abl.txz -C /tmp/m
  for n in 0 1 2 4 5 15; do echo "two rings abl $n: $(BIN=/tmp/m/bench_linear_abl run DSV4_MOE_ABLATE=$n)"; done
fi
for i in 1 2; do for b in /tmp/m/dsv4_main $B/tools/dsv4; do
  echo "$(basename $b): $(timeout 60 $b bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 8192 2>&1 | grep -E '^(prefill|1 )' | cut -c1-50 | tr '\n' ' ')"
done; done
# Decode's select at its 1024-entry rows (step 36, run 1: 1024-thread blocks 2-4 us a call faster
# than the 256-thread ones the rule picks below 256 rows); decode does not run the patched kernels.
for i in 1 2; do for f in auto 1024; do
  DSV4_INDEXER_SELECT=$f timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1,64 --prefill 512 > /tmp/e.log 2>&1
  echo "select $f: $(grep -E '^(1|64) ' /tmp/e.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
done; done
# The sanitizers last (slow; a cut-off run keeps the timings above).
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 $B/tests/cuda/cuda_moe_test \
    --gtest_filter='*PersistentMatchesWide*' > $OUT/$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.log | head -2 | tr '\n' ' ')"
done
