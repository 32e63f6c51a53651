#!/usr/bin/env bash
# ctest driver for the OpenAI-SDK tests: installs the pinned `openai` package (npm ci) into a
# scratch copy of tests/server/node, starts four `dsv4 serve` instances on free loopback
# ports (the real tiny model with an API key; the test-only scripted backend; a tiny KV
# budget that forces preemption; MTP speculative decoding), runs `node --test`, and stops the servers.
#   run_node_tests.sh DSV4_BIN SOURCE_DIR WORK_DIR
set -euo pipefail
BIN="$1" SRC="$2" WORK="$3"
rm -rf "$WORK"
mkdir -p "$WORK"
cp "$SRC"/tests/server/node/package.json "$SRC"/tests/server/node/package-lock.json "$SRC"/tests/server/node/*.mjs \
  "$SRC"/tests/server/node/*.json "$WORK"/
cd "$WORK"
npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1 || { cat npm.log; exit 1; }

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# start NAME ARGS...: runs `dsv4 serve` on port 0 and waits for /health; sets PORT_NAME, PID_NAME.
start() {
  local name="$1"; shift
  "$BIN" serve "$@" --host 127.0.0.1 --port 0 >"server-$name.log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  local port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "server-$name.log")
    if [[ -n "$port" ]] && node -e "fetch('http://127.0.0.1:$port/health').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"; then break; fi
    kill -0 "$pid" 2>/dev/null || { cat "server-$name.log"; echo "server $name died"; exit 1; }
    sleep 0.1
  done
  [[ -n "$port" ]] || { cat "server-$name.log"; echo "server $name did not start"; exit 1; }
  printf -v "PORT_$name" '%s' "$port"
  printf -v "PID_$name" '%s' "$pid"
}

MODEL="$SRC/models/tiny"
start real "$MODEL" --api-key test-key --served-model-name tiny
start fake "$MODEL" --served-model-name fake --fake-output-file "$WORK/fake_outputs.json" --max-model-len 4096
start smallkv "$MODEL" --served-model-name tiny --kv-memory 300KiB --max-model-len 256 --max-num-seqs 8
start spec "$MODEL" --served-model-name tiny --speculative-tokens 2

export DSV4_BIN="$BIN" DSV4_MODEL="$MODEL"
export DSV4_REAL_URL="http://127.0.0.1:$PORT_real" DSV4_REAL_PID="$PID_real"
export DSV4_FAKE_URL="http://127.0.0.1:$PORT_fake"
export DSV4_SMALLKV_URL="http://127.0.0.1:$PORT_smallkv"
export DSV4_SPEC_URL="http://127.0.0.1:$PORT_spec"
status=0
node --test --test-concurrency=1 ./*.test.mjs || status=$?
if [[ $status -ne 0 ]]; then for f in server-*.log; do echo "== $f"; tail -20 "$f"; done; fi
# Every server must still be alive (no crash on any input).
for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a server died during the tests"; status=1; }; done
exit $status
