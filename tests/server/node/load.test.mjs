// Bounded load on loopback: 64 concurrent streaming clients (a quarter hang up mid-stream)
// plus clients sending garbage. Every valid request completes, hung-up requests are
// cancelled in the engine (nothing left running, no sequence pages held), the server's
// resident memory returns to about its idle level, and /health is still ok.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { REAL, API_KEY, real, greedyChat, metrics, rssKiB, sleep, waitIdle } from './helpers.mjs';

const PID = Number(process.env.DSV4_REAL_PID);
const url = new URL(REAL);

// Raw TCP: send `data`, optionally half-close, read until the server closes (bounded).
function raw(data, { end = true, ms = 15_000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(url.port), url.hostname);
    let got = '';
    const timer = setTimeout(() => { s.destroy(); resolve(got); }, ms);
    s.on('connect', () => { s.write(data); if (end) s.end(); });
    s.on('data', (d) => { got += d; });
    s.on('error', () => {});
    s.on('close', () => { clearTimeout(timer); resolve(got); });
  });
}

function garbage(i) {
  const big = 'x'.repeat(64 * 1024);
  const body = (b) => `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`;
  const cases = [
    () => raw(Buffer.from(Array.from({ length: 4096 }, (_, k) => (k * 7919 + i) & 255))),  // random bytes
    () => raw('GET / HTTP/1.1\r\nHost: x\r\n'),                                          // headers never end
    () => raw(body('{"model": "tiny", "messages": [{"role": "user", "content": "hi"}'), {}), // truncated JSON
    () => raw(body('{"model": "tiny", "messages": "' + big + '"}')),                      // wrong type, big
    () => raw(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model"`), // short body
    () => raw(body('{"model": "tiny", "messages": [{"role": "user", "content": ' + '['.repeat(5000) + '}')),
    () => raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${API_KEY}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n`),
    () => raw(body('{"model":"tiny","messages":[{"role":"user","content":"\\ud800"}],"max_tokens":2}')),
  ];
  return cases[i % cases.length]();
}

async function streamOne(i) {
  const c = real();
  const hangUp = i % 4 === 3;
  const ac = new AbortController();
  // Hung-up requests ask for many tokens: if they were not cancelled the engine would stay busy.
  const body = { ...greedyChat(`load client ${i} ${'go '.repeat(i % 7)}`, hangUp ? 900 : 24), stream: true,
                 stream_options: { include_usage: true } };
  const stream = await c.chat.completions.create(body, { signal: ac.signal });
  let chunks = 0;
  let usage = null;
  let finish = null;
  try {
    for await (const ch of stream) {
      chunks++;
      if (ch.usage) usage = ch.usage;
      if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
      if (hangUp && chunks === 3) ac.abort();  // the SDK ends the loop (or throws) on abort
    }
  } catch (e) {
    if (!hangUp) throw e;
  }
  if (hangUp) assert.equal(finish, null, 'a hung-up stream should not have finished');
  return { hungUp: hangUp, usage, finish };
}

test('64 streaming clients, hang-ups and garbage: all valid requests complete, memory returns', { timeout: 240_000 }, async () => {
  // Warm up (allocator, thread stacks, first forward) and take the idle level.
  await Promise.all(Array.from({ length: 8 }, (_, i) => real().chat.completions.create(greedyChat(`warm ${i}`, 8))));
  await waitIdle(REAL);
  await sleep(500);
  const idle = rssKiB(PID);

  const started = Date.now();
  const results = await Promise.all([
    ...Array.from({ length: 64 }, (_, i) => streamOne(i)),
    ...Array.from({ length: 24 }, (_, i) => garbage(i).then(() => ({ garbage: true }))),
  ]);
  const valid = results.filter((r) => r.hungUp === false);
  assert.equal(valid.length, 48);
  for (const r of valid) {
    assert.equal(r.finish, 'length');
    assert.equal(r.usage.completion_tokens, 24);
  }
  // Hung-up requests were cancelled: the engine drains long before 16 × 900 tokens could run.
  const m = await waitIdle(REAL, 20_000);
  assert.equal(m.get('kv_cache_used_bytes'), m.get('prefix_cache_bytes'), 'sequence pages still held after hang-ups');
  assert.ok(Date.now() - started < 200_000);
  const aborted = Number(m.text.match(/request_success_total\{[^}]*finished_reason="abort"\} (\d+)/)?.[1] ?? 0);
  assert.ok(aborted >= 16, `expected the 16 hang-ups counted as aborted, got ${aborted}`);

  await sleep(1000);
  const after = rssKiB(PID);
  console.log(`VmRSS idle ${idle} KiB, after load ${after} KiB`);
  assert.ok(after <= idle * 1.25 + 16 * 1024, `RSS ${after} KiB vs idle ${idle} KiB`);
  const h = await fetch(`${REAL}/health`);
  assert.equal(h.status, 200);
  // Still serving normally.
  const r = await real().chat.completions.create(greedyChat('after the storm', 4));
  assert.equal(r.usage.completion_tokens, 4);
});
