#!/usr/bin/env bash
# Fuzzes the chat layer with libFuzzer under ASan+UBSan (leak checking on), for a bounded
# time per target: tokenizer (encode/decode/streaming detokenizer), prompt encoder (JSON
# messages), streaming output parser (chunking invariance, agreement with the strict parser).
#   scripts/fuzz-chat.sh [seconds-per-target=60] [target ...]
# Needs clang++ with libFuzzer (Debian: clang-14 libclang-rt-14-dev) and libpcre2-dev.
# Exit status is non-zero if any target finds a crash, sanitizer report, leak or hang.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(tokenizer encoder stream_parser)
cxx="${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++)}"
out="$root/build-fuzz"
mkdir -p "$out"

flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$root" -DDSV4_SOURCE_DIR="\"$root\"")
pcre=($(pkg-config --cflags --libs libpcre2-8))
srcs=("$root"/chat/{utf8,pretokenizer,tokenizer,detokenizer,json_dumps,encoding,output_parser,stream_parser}.cpp)

declare -A seeds=([tokenizer]=tokenizer [encoder]=encoder [stream_parser]=parser)
status=0
for t in "${targets[@]}"; do
  bin="$out/fuzz_$t"
  echo "== building $bin"
  "$cxx" "${flags[@]}" "$root/tests/chat/fuzz/fuzz_$t.cpp" "${srcs[@]}" "${pcre[@]}" -o "$bin"
  corpus="$out/corpus_$t"
  mkdir -p "$corpus"
  echo "== fuzzing $t for ${secs}s"
  # -timeout: an input taking >10 s counts as a hang; -rss_limit_mb catches blow-ups.
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -artifact_prefix="$out/crash_${t}_" -print_final_stats=1 "$corpus" "$root/tests/chat/fuzz/seeds/${seeds[$t]}" \
      > "$out/fuzz_$t.log" 2>&1; then
    echo "!! $t FAILED; see $out/fuzz_$t.log and $out/crash_${t}_*"
    tail -40 "$out/fuzz_$t.log"
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$out/fuzz_$t.log" | sed "s/^/   $t /"
    echo "   $t: no crash, leak or hang"
  fi
done
exit $status
