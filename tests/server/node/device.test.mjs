// Backend flags that cannot work end the process with a clear message (exit 1, no crash):
// --device cuda in a build without CUDA, or on a host without a GPU (with or without MTP
// speculation); a bad --device. Runs its own short-lived processes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

function serve(extra) {
  return new Promise((resolve) => {
    const p = spawn(process.env.DSV4_BIN, ['serve', process.env.DSV4_MODEL, '--port', '0', ...extra], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    p.stderr.on('data', (d) => {
      log += d;
      if (/listening on/.test(log)) p.kill('SIGTERM');  // a CUDA build on a GPU host: it works
    });
    p.on('exit', (code, sig) => resolve({ code, sig, log, started: /listening on/.test(log) }));
  });
}

test('--device cuda errors cleanly where there is no CUDA', { timeout: 120_000 }, async () => {
  const r = await serve(['--device', 'cuda']);
  if (r.started) return;  // CUDA build with a usable GPU
  assert.equal(r.sig, null, r.log);
  assert.equal(r.code, 1, r.log);
  assert.match(r.log, /--device cuda: (this build has no CUDA backend|no usable CUDA device)/);
});

test('--device cuda --speculative-tokens starts on a GPU or errors cleanly without one', { timeout: 120_000 }, async () => {
  const r = await serve(['--device', 'cuda', '--speculative-tokens', '2']);
  if (r.started) return;  // CUDA build with a usable GPU: MTP speculation on the device
  assert.equal(r.sig, null, r.log);
  assert.equal(r.code, 1, r.log);
  assert.match(r.log, /--device cuda: (this build has no CUDA backend|no usable CUDA device)/);
});

test('an unknown --device is an error naming it', async () => {
  const r = await serve(['--device', 'tpu']);
  assert.equal(r.code, 1, r.log);
  assert.match(r.log, /--device tpu: unsupported/);
});
