#!/usr/bin/env bash
# Measurement only (no patch; step 35, not yet run): with the rolled warp sort, is a warp a row
# also the fastest select at decode's shapes? The model buckets max_visible to multiples of 1024
# (visible_bucket), so decode rows at context 512 select over n = 1024; step 34's size rule gives
# them 256-thread blocks (R < 512, n > 128). Build main's bench_ops and dsv4 (scripts/prebuild.sh
# bench_ops dsv4, then recompress: gunzip -c .prebuilt/p.tgz | xz > .prebuilt/p.txz), run with
# carry [".prebuilt"] (~80 s); step35-combined-check.sh runs it beside the pieces-first check. If warp wins at n 1024 for R 1-256 and
# the e2e b1 / b64 with DSV4_INDEXER_SELECT=warp beat auto, widen the rule's warp case
# (form_by_size in backend/cuda/ops_indexer_select.cu) to max_visible <= 1024.
set -u
B=/tmp/b; mkdir -p $B; tar -xJf .prebuilt/p.txz -C $B
for n in 1024 512; do for R in 1 8 64 256; do
  line="n=$n R=$R"
  for f in warp 256 1024; do line="$line $f $(DSV4_INDEXER_SELECT=$f BENCH_OPS_ROWS=$R BENCH_INDEXER_ENTRIES=$n BENCH_INDEXER_SPLIT=1 timeout 30 $B/bench/bench_ops indexer 2>&1 | grep -E 'select' | awk '{for(i=1;i<=NF;i++) if($i=="us"){print $(i-1); exit}}')"; done
  echo "$line"
done; done
for i in 1 2 3; do for f in auto warp; do
  DSV4_INDEXER_SELECT=$f timeout 60 $B/tools/dsv4 bench --preset v4-flash --layers 8 --random-weights --batches 1,64 --prefill 512 > /tmp/e.log 2>&1
  echo "$f: $(grep -E '^(1|64) ' /tmp/e.log | tr -s ' ' | cut -d' ' -f1-3 | tr '\n' ' ')"
done; done
