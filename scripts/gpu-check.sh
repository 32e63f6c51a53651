#!/usr/bin/env bash
# On the GPU machine: configure + build the CUDA backend, run every GPU test (parity, model
# goldens), compute-sanitizer on the op tests, then the benchmarks. Logs go to $OUT; the last
# lines printed are a short summary. Usage: scripts/gpu-check.sh [tests|bench|spec-bench|quick|all]
# quick: ctest (no sanitizer, no CLI checks), bench_linear (BENCH_LINEAR=0 skips it, =moe / =linear
# runs one part), `dsv4 bench --profile` and step.
# verify: quick, then compute-sanitizer on the decode kernels' tests, the CLI speculative checks
# and the MTP bench (one lease: a short session's closing run). final: verify without the MTP
# bench, plus bench_ops (attention, indexer top-k at 16k / 64k / 256k entries).
# step: ncu kernel durations of one decode step at batch STEP_BATCH (default 1; scripts/ncu_step_summary.py).
# ops: bench_ops attention + indexer with the async scratch pool released / kept.
# moe: only the MoE test binary, bench_linear moe and `dsv4 bench --profile` (built alone: quick
# iterations on the expert kernels), with memcheck on the wgmma test and on MEMCHECK.
# (EXTRA_TESTS: test binaries built and run first in the moe modes.)
# moe-attn: moe plus the attention op test (and memcheck) and bench_ops attention (BENCH_OPS_PARTS
# picks other parts).
# moe-ncu: moe, then ncu of the wgmma expert kernels at 4096 tokens (sections, and the duration
# of every kernel of one MoeRunner::run).
# ops-ncu: bench_ops hc + attention, ncu of the mHC and attention kernels at 4096 rows, the
# EXTRA_TESTS and `dsv4 bench --profile`.
# moe-ws: the warp-specialised FP8 prefill expert kernels: bitwise tests, sanitizers, bench_linear,
# e2e prefill with and without them.
# moe-profile: bench_hops (µs per dependent hop: graph, PDL, persistent grid barrier), ncu sections
# (bandwidth, stalls, occupancy) of the tensor-core MoE kernels at 1 and 64
# tokens, of the FP8 tensor-core GEMV (wq_b, wo_a, wo_b at 1 row, with DRAM / L2 counters) and of
# the small kernels of a decode step.
# dev: EXTRA_TESTS, MEMCHECK ("binary filter;..."), bench_linear BENCH_LINEAR, bench_ops
# BENCH_OPS_PARTS, `dsv4 bench --profile`, GEN_CHECK=1: the CLI speculative checks, NSYS=1: nsys
# kernel sums of batch-1 graph steps, then step (a few decode kernels changed); E2E=0 / STEP=0
# skip the profile / step (PROF_BATCHES, PROF_PREFILL: the profile's sizes, default 1,16,64 and 4096).
# TARGETS="a b": build only those (any mode). E2E_AB (any mode): see e2e_ab.
# A PREBUILT archive holding bench/bench_ops_base (bench_ops of a baseline commit): dev runs it first.
# INDEXER_PROF=1 (dev): nsys kernel sums and ncu sections of the indexer top-k at 262144 entries.
# FP8_PROF=1 (dev): ncu sections and stall sampling of the FP8 wgmma expert kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-all}"
OUT="${OUT:-/tmp/dsv4-gpu-check}"
LOG="$(mktemp -d)"  # many logs; $OUT gets them as one archive (the device returns at most 8 files)
BUILD="${BUILD:-/tmp/dsv4-build}"
JOBS="$(nproc)"
mkdir -p "$OUT"
summary=()
# Archive after every phase: a run cut off by the lease still returns what it finished.
save() {
  printf '%s\n' "${summary[@]}" >"$LOG/summary.log"
  tar -czf "$OUT/gpu-logs.tgz" -C "$LOG" .
  cp "$LOG/summary.log" "$OUT/"
}

# `dsv4 bench --profile` (prefill and decode per-op tables); its log and bench_linear's to $OUT.
e2e_profile() {
  timeout 300 "$BUILD/tools/dsv4" bench --preset v4-flash --layers 8 --random-weights --batches "${PROF_BATCHES:-1,16,64}" \
    --prefill "${PROF_PREFILL:-4096}" --profile >"$LOG/e2e-profile.log" 2>&1
  summary+=("dsv4 bench --profile: rc=$?")
  cp "$LOG/e2e-profile.log" "$LOG/bench_linear.log" "$OUT/" 2>/dev/null
  save
}

# E2E_AB="VAR=value ...;VAR=value ...": `dsv4 bench` (no profile; batches E2E_BATCHES, default
# 1,16,64,256; prefill E2E_PREFILL, default 4096) with the default settings, then with each group of
# variables set, one after the other on the same machine; every table into the summary.
e2e_ab() {
  local batches="${E2E_BATCHES:-1,16,64,256}" prefill="${E2E_PREFILL:-4096}" sides=() i=0
  IFS=';' read -r -a sides <<<";$E2E_AB"
  for side in "${sides[@]}"; do
    local envs=()
    read -r -a envs <<<"$side"
    timeout 240 env "${envs[@]}" "$BUILD/tools/dsv4" bench --preset v4-flash --layers 8 --random-weights \
      --batches "$batches" --prefill "$prefill" >"$LOG/e2e-ab$i.log" 2>&1
    summary+=("dsv4 bench (${side:-default}): rc=$?")
    while IFS= read -r line; do summary+=("  $line"); done < <(grep -E "^prefill|^[0-9]+ +[0-9]|copy bandwidth" "$LOG/e2e-ab$i.log")
    save
    i=$((i + 1))
  done
}

# memcheck_spec SECONDS "binary filter": compute-sanitizer memcheck on one test binary (filter: a
# gtest glob, * when missing).
memcheck_spec() {
  local limit=$1
  set -f  # the filters are globs for gtest, not for the shell
  set -- $2
  set +f
  timeout "$limit" compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/$1" \
    --gtest_filter="${2:-*}" >"$LOG/sanitizer-$1.log" 2>&1
  summary+=("memcheck $1 (${2:-*}): rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/sanitizer-$1.log" | tail -1)")
}

# The EXTRA_TESTS binaries, each whole; failures' lines into extra-tests-summary.log.
run_extra_tests() {
  for t in "${extra[@]}"; do
    timeout 200 "$BUILD/tests/cuda/$t" >"$LOG/$t.log" 2>&1
    summary+=("$t: rc=$? $(grep -E 'PASSED|FAILED' "$LOG/$t.log" | tr '\n' ' ')")
    grep -E "Failure|Expected|Which is|error|rel" "$LOG/$t.log" | head -30 >>"$LOG/extra-tests-summary.log"
  done
  cp "$LOG/extra-tests-summary.log" "$OUT/" 2>/dev/null
}

# Greedy CLI generation with and without MTP speculation (k = 1..3 verify 2-4 rows): same ids.
generate_check() {
  gen=("$BUILD/tools/dsv4" generate --device cuda --prompt-ids 3,17,99,250,7,7,41 --max-new-tokens 40)
  want=$("${gen[@]}" 2>"$LOG/generate-plain.log")
  for k in 1 2 3; do
    got=$("${gen[@]}" --speculative-tokens $k 2>"$LOG/generate-spec-$k.log")
    [[ -n "$want" && "$got" == "$want" ]] && r=same || r="DIFFERENT ($got vs $want)"
    summary+=("generate --device cuda --speculative-tokens $k: $r; $(grep speculative "$LOG/generate-spec-$k.log")")
  done
  save
}

# PREBUILT=file.tgz: binaries built elsewhere (same relative paths as the build tree: tools/dsv4,
# bench/..., tests/cuda/...) are unpacked into $BUILD and used without building, if they run here
# (a machine image with other system libraries falls back to the build below).
if [[ -n "${PREBUILT:-}" ]]; then
  mkdir -p "$BUILD" && tar -xzf "$PREBUILT" -C "$BUILD"
  if "$BUILD/tools/dsv4" --help >/dev/null 2>&1; then
    summary+=("prebuilt binaries from $PREBUILT")
    SKIP_BUILD=1
  else
    summary+=("prebuilt binaries do not run here: building")
  fi
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ "${SKIP_BUILD:-0}" == 1 ]]; then :
elif ! cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DDSV4_CHAT=OFF \
     -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" >"$LOG/configure.log" 2>&1; then
  tail -30 "$LOG/configure.log"; cp "$LOG/configure.log" "$OUT/"; echo "configure FAILED"; exit 1
fi
targets=()
# EXTRA_TESTS="cuda_linear_test ...": more test binaries that the moe modes build and run first.
read -r -a extra <<<"${EXTRA_TESTS:-}"
[[ "$MODE" == moe || "$MODE" == moe-ncu ]] && targets=(--target cuda_moe_test bench_linear dsv4 "${extra[@]}")
[[ "$MODE" == ops-ncu ]] && targets=(--target bench_ops dsv4 "${extra[@]}")
[[ "$MODE" == moe-attn ]] && targets=(--target cuda_moe_test cuda_ops_attention_test bench_linear bench_ops dsv4 "${extra[@]}")
[[ "$MODE" == dev ]] && targets=(--target bench_linear bench_ops dsv4 "${extra[@]}")
[[ "$MODE" == moe-ws || "$MODE" == moe-profile ]] && targets=(--target cuda_moe_test bench_linear bench_hops bench_stream dsv4)
if [[ -n "${TARGETS:-}" ]]; then read -r -a only <<<"$TARGETS"; targets=(--target "${only[@]}"); fi
if [[ "${SKIP_BUILD:-0}" != 1 ]] && ! cmake --build "$BUILD" -j"$JOBS" "${targets[@]}" >"$LOG/build.log" 2>&1; then
  grep -E "error|Error" "$LOG/build.log" | head -40; cp "$LOG/build.log" "$OUT/"; echo "build FAILED"; exit 1
fi
summary+=("build ok")
save

if [[ "$MODE" == quick || "$MODE" == verify || "$MODE" == final ]]; then
  ctest --test-dir "$BUILD" --output-on-failure -j4 --timeout 300 >"$LOG/ctest.log" 2>&1
  summary+=("ctest: $(grep -E 'tests passed|tests failed' "$LOG/ctest.log" | tail -1)")
  grep -E "failed|Failed|FAILED" "$LOG/ctest.log" | head -20 >>"$LOG/summary-failures.log"
  grep -E "max \|cuda|fast vs exact|pooled" "$LOG/ctest.log" | sort -u >"$LOG/model-numbers.log"
  save
  # BENCH_LINEAR=0: skip (its numbers did not change); linear / moe: only that part.
  if [[ "${BENCH_LINEAR:-1}" != 0 ]]; then
    part=(); [[ "${BENCH_LINEAR:-1}" != 1 ]] && part=("$BENCH_LINEAR")
    timeout 200 "$BUILD/bench/bench_linear" "${part[@]}" >"$LOG/bench_linear.log" 2>&1
    summary+=("bench_linear: rc=$?")
  fi
  e2e_profile
fi

# dev: the EXTRA_TESTS binaries, memcheck on MEMCHECK ("binary filter;binary filter"),
# bench_linear BENCH_LINEAR (a part name), bench_ops BENCH_OPS_PARTS, dsv4 bench --profile and
# the ncu decode step: one round trip for a change to a few decode kernels.
if [[ "$MODE" == dev ]]; then
  run_extra_tests
  IFS=';' read -r -a checks <<<"${MEMCHECK:-}"
  for spec in "${checks[@]}"; do memcheck_spec 150 "$spec"; done
  save
  if [[ "${BENCH_LINEAR:-linear}" != 0 ]]; then
    timeout 200 "$BUILD/bench/bench_linear" ${BENCH_LINEAR:-linear} >"$LOG/bench_linear.log" 2>&1
    summary+=("bench_linear ${BENCH_LINEAR:-linear}: rc=$?")
  fi
  read -r -a ops_parts <<<"${BENCH_OPS_PARTS:-attention}"
  if [[ -x "$BUILD/bench/bench_ops_base" ]]; then  # a baseline build's bench_ops (PREBUILT): before/after in one run
    timeout 200 "$BUILD/bench/bench_ops_base" "${ops_parts[@]}" >"$LOG/bench_ops-base.log" 2>&1
    summary+=("bench_ops_base ${ops_parts[*]}: rc=$?")
    cp "$LOG/bench_ops-base.log" "$OUT/" 2>/dev/null
  fi
  timeout 200 "$BUILD/bench/bench_ops" "${ops_parts[@]}" >"$LOG/bench_ops.log" 2>&1
  summary+=("bench_ops ${ops_parts[*]}: rc=$?")
  cp "$LOG/bench_ops.log" "$OUT/" 2>/dev/null
  [[ "${E2E:-1}" == 1 ]] && e2e_profile
  [[ "${GEN_CHECK:-0}" == 1 ]] && generate_check
  if [[ "${NSYS:-0}" == 1 ]] && command -v nsys >/dev/null; then
    # Kernel durations at the running clock inside the replayed batch-1 graphs (ncu serialises
    # and locks clocks): nsys traces each graph node.
    timeout 200 nsys profile --cuda-graph-trace=node -o "$LOG/b1" --force-overwrite true \
      "$BUILD/tools/dsv4" bench --preset v4-flash --layers 8 --random-weights --batches 1 --prefill 64 --steps 20 \
      >"$LOG/nsys.log" 2>&1
    timeout 120 nsys stats -r cuda_gpu_kern_sum --format csv -o "$LOG/b1" "$LOG/b1.nsys-rep" >>"$LOG/nsys.log" 2>&1
    summary+=("nsys b1: rc=$?")
    cp "$LOG"/b1_cuda_gpu_kern_sum.csv "$OUT/" 2>/dev/null
    save
  fi
fi

if [[ "$MODE" == dev && "${FP8_PROF:-0}" == 1 ]]; then
  # ncu sections of the FP8 wgmma expert kernels: the decode tiles' gate/up at 8 tokens, and the
  # prefill tiles' (DSV4_MOE_PREFILL_FP8=1 makes them the by-size default) at 4096 tokens, with
  # the stall sampling by source line (why they ran 5x below the instruction-count estimate).
  for case in "decode 8 gateup_fp8_kernel 3" "wide 4096 gateup_fp8_wide_kernel 2"; do
    set -- $case
    DSV4_MOE_PREFILL_FP8=1 BENCH_MOE_TOKENS=$2 timeout 200 ncu --kernel-name regex:"$3" --launch-skip "$4" \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section SourceCounters "$BUILD/bench/bench_linear" moe \
      >"$LOG/ncu-fp8-$1.txt" 2>&1
    summary+=("ncu fp8 $1: rc=$?")
    cp "$LOG/ncu-fp8-$1.txt" "$OUT/" 2>/dev/null
  done
  save
fi

if [[ "$MODE" == step || "$MODE" == quick || ( "$MODE" == dev && "${STEP:-1}" == 1 ) || "$MODE" == verify || "$MODE" == final ]]; then
  # Each kernel's own duration in one eager decode step at batch STEP_BATCH (default 1; what a
  # graph replay pays).
  timeout 200 ncu --nvtx --nvtx-include "dsv4_decode_step/" --metrics gpu__time_duration.sum --csv \
    "$BUILD/tools/dsv4" bench --preset v4-flash --layers 8 --random-weights --batches "${STEP_BATCH:-1}" --prefill 64 --steps 2 \
    --profile >"$LOG/ncu-step.csv" 2>"$LOG/ncu-step.err"
  python3 scripts/ncu_step_summary.py "$LOG/ncu-step.csv" >"$LOG/ncu-step-summary.log" 2>&1
  summary+=("ncu step: $(head -1 "$LOG/ncu-step-summary.log")")
  cp "$LOG/ncu-step-summary.log" "$OUT/" 2>/dev/null
  save
fi

if [[ "$MODE" == final ]]; then
  timeout 200 "$BUILD/bench/bench_ops" >"$LOG/bench_ops.log" 2>&1
  summary+=("bench_ops: rc=$?")
  cp "$LOG/bench_ops.log" "$OUT/" 2>/dev/null
  save
fi

if [[ "$MODE" == ops ]]; then
  # bench_ops attention + indexer with the scratch pool released at every sync (driver default)
  # and kept (async_scratch.h): the before/after of keep_async_pool.
  DSV4_KEEP_POOL=0 timeout 200 "$BUILD/bench/bench_ops" attention indexer >"$LOG/bench_ops-pool-released.log" 2>&1
  summary+=("bench_ops (pool released): rc=$?")
  timeout 200 "$BUILD/bench/bench_ops" attention indexer >"$LOG/bench_ops.log" 2>&1
  summary+=("bench_ops: rc=$?")
  save
fi

if [[ "$MODE" == dev && "${INDEXER_PROF:-0}" == 1 ]]; then
  # The indexer top-k at one row of 262144 entries: nsys kernel sums (each kernel of the scoring
  # and the selection at the running clock) and ncu sections of the bf16 scoring kernel.
  export BENCH_OPS_ROWS=1 BENCH_INDEXER_ENTRIES=262144
  if command -v nsys >/dev/null; then
    timeout 150 nsys profile -o "$LOG/ix" --force-overwrite true "$BUILD/bench/bench_ops" indexer >"$LOG/nsys-ix.log" 2>&1
    timeout 120 nsys stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv -o "$LOG/ix" "$LOG/ix.nsys-rep" \
      >>"$LOG/nsys-ix.log" 2>&1
    summary+=("nsys indexer: rc=$?")
    cp "$LOG"/ix_cuda_gpu_kern_sum.csv "$OUT/" 2>/dev/null
  fi
  timeout 150 ncu --kernel-name-base demangled --kernel-name regex:"indexer_score_w?g?mma_kernel<__nv_bfloat16>" \
    --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section SchedulerStats --section LaunchStats "$BUILD/bench/bench_ops" indexer \
    >"$LOG/ncu-ix-score.txt" 2>&1
  summary+=("ncu indexer score: rc=$?")
  timeout 150 ncu --kernel-name regex:"chunk_|select_candidates" --launch-skip 9 --launch-count 3 \
    --section SpeedOfLight --section WarpStateStats "$BUILD/bench/bench_ops" indexer >"$LOG/ncu-ix-select.txt" 2>&1
  summary+=("ncu indexer select: rc=$?")
  cp "$LOG/ncu-ix-score.txt" "$LOG/ncu-ix-select.txt" "$OUT/" 2>/dev/null
  unset BENCH_OPS_ROWS BENCH_INDEXER_ENTRIES
  save
fi

if [[ "$MODE" == moe-attn ]]; then
  timeout 200 "$BUILD/tests/cuda/cuda_ops_attention_test" >"$LOG/attn-test.log" 2>&1
  summary+=("cuda_ops_attention_test: rc=$? $(grep -E 'PASSED|FAILED' "$LOG/attn-test.log" | tr '\n' ' ')")
  grep -E "Failure|Expected|Which is|error|rel" "$LOG/attn-test.log" | head -30 >"$LOG/attn-test-summary.log"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/cuda_ops_attention_test" \
    >"$LOG/sanitizer-attn.log" 2>&1
  summary+=("memcheck attention: rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/sanitizer-attn.log" | tail -1)")
  read -r -a ops_parts <<<"${BENCH_OPS_PARTS:-attention}"
  timeout 200 "$BUILD/bench/bench_ops" "${ops_parts[@]}" >"$LOG/bench_ops.log" 2>&1
  summary+=("bench_ops ${ops_parts[*]}: rc=$?")
  cp "$LOG/attn-test-summary.log" "$LOG/bench_ops.log" "$OUT/" 2>/dev/null
  save
fi

if [[ "$MODE" == ops-ncu ]]; then
  # bench_ops hc + attention, then ncu sections of the mHC and tensor-core attention kernels at
  # 4096 rows (BENCH_OPS_ROWS), then `dsv4 bench --profile`.
  timeout 200 "$BUILD/bench/bench_ops" hc attention >"$LOG/bench_ops.log" 2>&1
  summary+=("bench_ops hc attention: rc=$?")
  cp "$LOG/bench_ops.log" "$OUT/" 2>/dev/null
  sections=(--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats
            --section SchedulerStats --section MemoryWorkloadAnalysis)
  BENCH_OPS_ROWS=4096 timeout 150 ncu --kernel-name regex:"hc_project|hc_pre_finish" --launch-skip 6 --launch-count 3 \
    "${sections[@]}" "$BUILD/bench/bench_ops" hc >"$LOG/ncu-hc.txt" 2>&1
  summary+=("ncu hc: rc=$?")
  BENCH_OPS_ROWS=4096 timeout 150 ncu --kernel-name regex:"attention_mma" --launch-skip 3 --launch-count 1 \
    "${sections[@]}" --section ComputeWorkloadAnalysis "$BUILD/bench/bench_ops" attention >"$LOG/ncu-attn.txt" 2>&1
  summary+=("ncu attention: rc=$?")
  cp "$LOG/ncu-hc.txt" "$LOG/ncu-attn.txt" "$OUT/" 2>/dev/null
  save
fi

if [[ "$MODE" == moe || "$MODE" == moe-ncu || "$MODE" == moe-attn || "$MODE" == ops-ncu ]]; then
  run_extra_tests
fi

if [[ "$MODE" == moe || "$MODE" == moe-ncu || "$MODE" == moe-attn ]]; then
  timeout 200 "$BUILD/tests/cuda/cuda_moe_test" >"$LOG/moe-test.log" 2>&1
  summary+=("cuda_moe_test: rc=$? $(grep -E 'PASSED|FAILED' "$LOG/moe-test.log" | tr '\n' ' ')")
  grep -E "moe wgmma|Failure|Expected|Which is|error" "$LOG/moe-test.log" | head -40 >"$LOG/moe-test-summary.log"
  if [[ "${MEMCHECK_WGMMA:-1}" == 1 ]]; then  # 0: skip (the wgmma kernels did not change)
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/cuda_moe_test" \
      --gtest_filter='*Wgmma*' >"$LOG/sanitizer-moe-wgmma.log" 2>&1
    summary+=("memcheck wgmma: rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/sanitizer-moe-wgmma.log" | tail -1)")
  fi
  IFS=';' read -r -a checks <<<"${MEMCHECK:-}"
  for spec in "${checks[@]}"; do memcheck_spec 150 "$spec"; done
  cp "$LOG/moe-test-summary.log" "$OUT/" 2>/dev/null
  save
  timeout 200 "$BUILD/bench/bench_linear" moe >"$LOG/bench_linear.log" 2>&1
  summary+=("bench_linear moe: rc=$?")
  cp "$LOG/bench_linear.log" "$OUT/" 2>/dev/null
  save
fi
[[ ( "$MODE" == moe || "$MODE" == moe-ncu || "$MODE" == moe-attn || "$MODE" == ops-ncu ) && "${E2E:-1}" == 1 ]] && e2e_profile
[[ -n "${E2E_AB:-}" ]] && e2e_ab

if [[ "$MODE" == moe-ncu ]]; then
  # BENCH_MOE_TOKENS=4096: packed experts only; the default tiles are wgmma. Skip one warm-up call.
  BENCH_MOE_TOKENS=4096 timeout 200 ncu --kernel-name regex:"wgmma_kernel" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    "$BUILD/bench/bench_linear" moe >"$LOG/ncu-wgmma.txt" 2>&1
  summary+=("ncu wgmma: rc=$?")
  BENCH_MOE_TOKENS=4096 timeout 120 ncu --kernel-name regex:"group_kernel|quant_bf16_kernel|wgmma_kernel|combine_kernel" \
    --launch-skip 12 --launch-count 6 --section SpeedOfLight "$BUILD/bench/bench_linear" moe >"$LOG/ncu-wgmma-run.txt" 2>&1
  summary+=("ncu wgmma run: rc=$?")
  cp "$LOG/ncu-wgmma.txt" "$LOG/ncu-wgmma-run.txt" "$OUT/" 2>/dev/null
  save
fi

if [[ "$MODE" == moe-ws || "$MODE" == moe-profile ]]; then
  # The fixed cost of a dependent hop (graph chain, PDL chain) against a persistent kernel's grid
  # barrier: what the batch-1 chain's ~17 hops a layer cost, in seconds of runtime (first: it takes
  # seconds).
  timeout 60 "$BUILD/bench/bench_hops" >"$LOG/bench_hops.log" 2>&1
  summary+=("bench_hops: rc=$? $(grep -E 'per hop|not co-resident' "$LOG/bench_hops.log" | tr -s ' ' | tr '\n' ';')")
  # What a pure reader of the decode step's weight sizes reaches (the GEMVs' ideal), if built.
  if [[ -x "$BUILD/bench/bench_stream" ]]; then
    timeout 60 "$BUILD/bench/bench_stream" >"$LOG/bench_stream.log" 2>&1
    summary+=("bench_stream: rc=$?")
    cp "$LOG/bench_stream.log" "$OUT/" 2>/dev/null
  fi
  save
fi

if [[ "$MODE" == moe-ws ]]; then
  # The warp-specialised FP8 prefill expert kernels (set_moe_wide_tiles 5-8,
  # DSV4_MOE_PREFILL_WS 1-4: one or two producer warpgroups, the proxy fence in the producers
  # or the consumers) against the wide ones: the bitwise tests (the two-producer forms alone
  # under a short limit: a wrong register split hangs), bench_linear moe at MOE_WS_TOKENS (default 2048,4096,8192) for the FP8 variants that
  # passed, WS_NCU=1: ncu of the gate/up of each form in WS_NCU_FORMS, then e2e prefill 8192
  # with the forms and without, alternating (E2E_AB's machinery), then memcheck / synccheck /
  # racecheck (WS_SANITIZERS) on the bitwise tests.
  timeout 150 "$BUILD/tests/cuda/cuda_moe_test" --gtest_filter='*Fp8*:*Wgmma*:*BySize*:*Removed*:-*TwoProducers*' >"$LOG/moe-ws-test.log" 2>&1
  rc=$?
  summary+=("cuda_moe_test Fp8/Wgmma: rc=$rc $(grep -E 'PASSED|FAILED' "$LOG/moe-ws-test.log" | tr -s ' ' | tr '\n' ';')")
  grep -E "differ from" "$LOG/moe-ws-test.log" | grep -v " 0 of " | head -5 >>"$LOG/summary-failures.log"
  skip="${WS_BENCH_SKIP:-}"; skip_tests=""  # WS_BENCH_SKIP=a,b: bench variants left out anyway
  for t in TwoProducers:ws2; do
    timeout 60 "$BUILD/tests/cuda/cuda_moe_test" --gtest_filter="*${t%%:*}*" >"$LOG/moe-ws-${t##*:}-test.log" 2>&1
    rct=$?
    summary+=("cuda_moe_test ${t%%:*}: rc=$rct $(grep -E 'PASSED|FAILED' "$LOG/moe-ws-${t##*:}-test.log" | tr -s ' ' | tr '\n' ';')")
    grep -E "differ from" "$LOG/moe-ws-${t##*:}-test.log" | grep -v " 0 of " | head -5 >>"$LOG/summary-failures.log"
    [[ $rct == 0 ]] || { skip="$skip${skip:+,}${t##*:}"; skip_tests="$skip_tests:*${t%%:*}*"; }
  done
  save
  if [[ $rc == 0 ]]; then
    BENCH_MOE_TOKENS="${MOE_WS_TOKENS:-2048,4096,8192}" BENCH_MOE_VARIANT=fp8 BENCH_MOE_SKIP="$skip" timeout 200 "$BUILD/bench/bench_linear" moe \
      >"$LOG/bench_linear-ws.log" 2>&1
    summary+=("bench_linear moe fp8: rc=$?")
    while IFS= read -r line; do summary+=("  $line"); done < <(grep -E "moe fp4" "$LOG/bench_linear-ws.log")
    save
    if [[ "${WS_NCU:-0}" == 1 ]]; then
      # Where each form's gate/up waits: sections and the stall sampling by source line, one
      # launch at 4096 tokens (launch 2 of the kernel: after a warm-up call's gate/up and down) of
      # the by-size default run as each DSV4_MOE_PREFILL_WS form in WS_NCU_FORMS (only the default
      # variant runs: BENCH_MOE_VARIANT matches none).
      IFS=',' read -r -a ncu_forms <<<"${WS_NCU_FORMS:-2,4}"
      i=0
      for v in "${ncu_forms[@]}"; do
        DSV4_MOE_PREFILL_WS="$v" BENCH_MOE_TOKENS=4096 BENCH_MOE_VARIANT=none timeout 150 ncu --kernel-name regex:"fp8_ws_kernel" \
          --launch-skip 2 --launch-count 1 --import-source yes --section SpeedOfLight --section WarpStateStats \
          --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
          --section SourceCounters --section InstructionStats "$BUILD/bench/bench_linear" moe >"$LOG/ncu-ws-gateup$i.txt" 2>&1
        summary+=("ncu form $v gateup: rc=$? $(grep -E ' Duration|Compute \(SM\) Throughput|L2 Cache Throughput|L1/TEX Hit|Issue Slots Busy|No Eligible' "$LOG/ncu-ws-gateup$i.txt" | tr -s ' ' | tr '\n' ';')")
        cp "$LOG/ncu-ws-gateup$i.txt" "$OUT/" 2>/dev/null
        save
        i=$((i + 1))
      done
    fi
    # e2e sides after the default (form 2): the wide kernels, twice.
    ws_sides="DSV4_MOE_PREFILL_WS=0"
    ws_sides="$ws_sides;;$ws_sides"
    E2E_BATCHES="${E2E_BATCHES:-1}" E2E_PREFILL="${E2E_PREFILL:-8192}" E2E_AB="${WS_E2E_AB:-$ws_sides}"
    [[ "${WS_E2E:-1}" == 1 ]] && e2e_ab
    E2E_AB=""
    for tool in ${WS_SANITIZERS:-memcheck synccheck racecheck}; do
      timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/cuda/cuda_moe_test" \
        --gtest_filter="*Fp8WarpSpecialised*${skip_tests:+:-}${skip_tests#:}" >"$LOG/sanitizer-ws-$tool.log" 2>&1
      summary+=("$tool ws: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/sanitizer-ws-$tool.log" | tail -1)")
      save
    done
  fi
fi

if [[ "$MODE" == moe-profile ]]; then
  # bench_linear moe, packed experts (the layout a Fast model runs): per token count and kernel
  # variant (default FP8 wgmma, mma.sync, mma.sync rb1, mma.sync occ2) 28 calls of (gateup,
  # down); skip three warm-up calls of the default. 1 token: launches 6-7; 64 tokens: after 2
  # token counts x 4 variants x 28 calls.
  [[ "${PROFILE_NCU_MOE:-1}" == 1 ]] && for case in "1tok 6" "64tok 454"; do
    set -- $case
    timeout 150 ncu --kernel-name-base demangled --kernel-name regex:"_fp8_kernel|mma_kernel<.*\(bool\)1" \
      --launch-skip "$2" --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats --section SchedulerStats "$BUILD/bench/bench_linear" moe >"$LOG/ncu-moe-$1.txt" 2>&1
    summary+=("ncu moe $1: rc=$?")
    cp "$LOG/ncu-moe-$1.txt" "$OUT/" 2>/dev/null
  done
  # The FP8 tensor-core GEMV at 1 row on the three 32 MB weights, one each (bench_linear's
  # filters leave only that weight and row count: launch 3 is the first timed call after the
  # warm-ups), with the DRAM and L2 counters that step 22 left as the next look.
  for wname in wq_b wo_a wo_b; do
    BENCH_LINEAR_ONLY=$wname BENCH_LINEAR_ROWS=1 timeout 150 ncu --kernel-name regex:"fp8_mma_gemv" --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
      --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max \
      "$BUILD/bench/bench_linear" linear >"$LOG/ncu-fp8-gemv-$wname.txt" 2>&1
    summary+=("ncu fp8 gemv $wname: rc=$? $(grep -E ' Duration|dram__throughput' "$LOG/ncu-fp8-gemv-$wname.txt" | tr -s ' ' | tr '\n' ';')")
    cp "$LOG/ncu-fp8-gemv-$wname.txt" "$OUT/" 2>/dev/null
  done
  # The small per-layer kernels of a batch-1 decode step (one launch of each; PROFILE_SMALL_OPS=0 skips).
  [[ "${PROFILE_SMALL_OPS:-1}" == 1 ]] && timeout 150 ncu --nvtx --nvtx-include "dsv4_decode_step/" \
    --kernel-name regex:"hc_project|hc_pre_finish|attention_kernel|attention_merge|moe_route|rms_norm|quant_kernel" \
    --launch-count 30 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section Occupancy "$BUILD/tools/dsv4" bench --preset v4-flash --layers 4 --random-weights --batches 1 \
    --prefill 64 --steps 1 --profile >"$LOG/ncu-small-ops.txt" 2>&1
  summary+=("ncu small ops: rc=$?")
  cp "$LOG/ncu-small-ops.txt" "$OUT/" 2>/dev/null
  save
fi

if [[ "$MODE" == verify || "$MODE" == final ]]; then
  # The kernels a Fast decode step runs (packed MoE, tensor-core GEMV, mHC, norm + RoPE, attention,
  # routing, the indexer, the fast tiny models end to end) under memcheck; one filter per binary
  # keeps it to a few minutes.
  for spec in "cuda_moe_test *Packed*" "cuda_linear_test *Fp8Mma*:*Grouped*:*SharedInput*" "cuda_ops_norm_test *" \
              "cuda_ops_mhc_test *" "cuda_ops_attention_test *" "cuda_ops_moe_route_test *" \
              "cuda_ops_indexer_test *" "cuda_model_test CudaFastPath*"; do
    memcheck_spec 100 "$spec"
  done
  save
fi

if [[ "$MODE" == tests || "$MODE" == all || "$MODE" == verify || "$MODE" == final ]]; then
  if [[ "$MODE" != verify && "$MODE" != final ]]; then
    ctest --test-dir "$BUILD" --output-on-failure -j4 --timeout 300 >"$LOG/ctest.log" 2>&1
    summary+=("ctest: $(grep -E 'tests passed|tests failed' "$LOG/ctest.log" | tail -1)")
    grep -E "max \|cuda|fast vs exact|pooled" "$LOG/ctest.log" | sort -u >"$LOG/model-numbers.log"
    save
    for t in "$BUILD"/tests/cuda/*_test; do
      [[ -x "$t" ]] || continue
      name=$(basename "$t")
      filter=""
      # The long engine-level tests run without the sanitizer (it is ~50x slower); one case each.
      [[ "$name" == cuda_model_test ]] && filter="--gtest_filter=*ExactDecode*/a"
      [[ "$name" == cuda_rollback_test ]] && filter="--gtest_filter=*TruncatedVerify*/0"
      [[ "$name" == cuda_backend_test ]] && filter="--gtest_filter=*VerifyChunk*"
      [[ "$name" == cuda_mtp_test ]] && filter="--gtest_filter=*CpuModule*/a"
      [[ "$name" == cuda_linear_test ]] && filter="--gtest_filter=*Fp8Mma*:*Grouped*:*Exact*"
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" $filter >"$LOG/sanitizer-$name.log" 2>&1
      summary+=("memcheck $name: rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/sanitizer-$name.log" | tail -1)")
    done
    save
  fi
  # MTP speculation through the CLI: greedy tokens identical to plain decoding for k = 1..3.
  generate_check
fi

if [[ "$MODE" == bench || "$MODE" == all ]]; then
  for b in "$BUILD"/bench/bench_*; do
    [[ -x "$b" ]] || continue
    timeout 200 "$b" >"$LOG/$(basename "$b").log" 2>&1
    summary+=("$(basename "$b"): rc=$?")
  done
  timeout 240 "$BUILD/tools/dsv4" bench --preset v4-flash --layers 8 --random-weights --batches 1,16,64 >"$LOG/e2e-bench.log" 2>&1
  summary+=("dsv4 bench: rc=$? $(tail -4 "$LOG/e2e-bench.log" | tr '\n' ';')")
  save
fi

if [[ "$MODE" == spec-bench || "$MODE" == all || "$MODE" == verify ]]; then
  timeout 300 "$BUILD/tools/dsv4" bench --preset v4-flash --layers 8 --random-weights --batches 1,16 --prefill 512 \
    --speculative-tokens 2 >"$LOG/spec-bench.log" 2>&1
  summary+=("dsv4 bench --speculative-tokens 2: rc=$? $(tail -5 "$LOG/spec-bench.log" | tr '\n' ';')")
  cp "$LOG/spec-bench.log" "$OUT/" 2>/dev/null
  save
fi

save
[[ -f "$LOG/model-numbers.log" ]] && cp "$LOG/model-numbers.log" "$OUT/"
cat "$LOG/summary.log"
