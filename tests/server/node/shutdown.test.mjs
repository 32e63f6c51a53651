// Graceful shutdown: SIGTERM during a stream ends it cleanly (final chunk + [DONE]), new
// requests are refused, and the process exits 0. Runs its own server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { client } from './helpers.mjs';

function startServer(extra) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.env.DSV4_BIN, ['serve', process.env.DSV4_MODEL, '--port', '0', ...extra], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    p.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) resolve({ p, url: m[1], log: () => log });
    });
    p.on('exit', (code) => reject(new Error(`server exited ${code}: ${log}`)));
  });
}

const exited = (p) => new Promise((r) => p.on('exit', (code, sig) => r({ code, sig })));

for (const [name, grace, expectFinish] of [
  ['in-flight stream is cancelled after the grace period', '0', 'abort'],
  ['in-flight stream finishes within the grace period', '30', 'length'],
]) {
  test(`SIGTERM: ${name}`, { timeout: 60_000 }, async () => {
    const s = await startServer(['--served-model-name', 'tiny', '--shutdown-grace', grace]);
    const done = exited(s.p);
    const c = client(s.url);
    const max_tokens = grace === '0' ? 1000 : 60;
    const stream = await c.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'long answer' }], max_tokens, temperature: 0, ignore_eos: true,
      thinking: { type: 'disabled' }, stream: true, stream_options: { include_usage: true },
    });
    let chunks = 0;
    let finish = null;
    let usage = null;
    for await (const ch of stream) {
      if (++chunks === 3) s.p.kill('SIGTERM');
      if (ch.choices.length && ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
      if (ch.usage) usage = ch.usage;
    }
    // The SDK only ends the loop cleanly on [DONE]; the finish chunk and usage came first.
    assert.equal(finish, expectFinish);
    assert.ok(usage);
    if (expectFinish === 'length') assert.equal(usage.completion_tokens, max_tokens);
    else assert.ok(usage.completion_tokens < max_tokens);
    const { code } = await done;
    assert.equal(code, 0, s.log());
  });
}
