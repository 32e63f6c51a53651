// Continuous batching through the server: concurrent requests give the greedy outputs they
// give one at a time; prefix-cache hits give identical outputs; a tiny --kv-memory forces
// preemption and every request still completes with the same outputs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { REAL, SMALLKV, real, smallkv, greedyChat, metrics, waitIdle } from './helpers.mjs';

const prompts = Array.from({ length: 8 }, (_, i) => `Request number ${i}: ${'tell me more '.repeat(i + 1)}`);
const text = (r) => r.choices[0].message.content;

test('N concurrent requests = the same requests one at a time (greedy)', async () => {
  const c = real();
  const alone = [];
  for (const p of prompts) alone.push(text(await c.chat.completions.create(greedyChat(p, 24))));
  const together = await Promise.all(prompts.map((p) => c.chat.completions.create(greedyChat(p, 24))));
  assert.deepEqual(together.map(text), alone);
  // Streaming concurrently too.
  const streamed = await Promise.all(
    prompts.map(async (p) => {
      let s = '';
      for await (const ch of await c.chat.completions.create({ ...greedyChat(p, 24), stream: true }))
        if (ch.choices.length && ch.choices[0].delta.content) s += ch.choices[0].delta.content;
      return s;
    }),
  );
  assert.deepEqual(streamed, alone);
});

test('prefix-cache hits give identical outputs', async () => {
  const c = real();
  const shared = 'You are a careful assistant. '.repeat(8);  // past one 64-token cache block
  const before = (await metrics(REAL)).get('prefix_cache_hit_tokens_total');
  const first = await c.chat.completions.create(greedyChat(shared + 'Question one?', 20));
  const second = await c.chat.completions.create(greedyChat(shared + 'Question one?', 20));
  assert.equal(text(second), text(first));
  assert.ok(second.usage.prompt_tokens_details.cached_tokens >= 64, JSON.stringify(second.usage));
  assert.equal(second.usage.prompt_cache_hit_tokens, second.usage.prompt_tokens_details.cached_tokens);
  // A different suffix hits the shared prefix and still matches its own cold run.
  const other = await c.chat.completions.create(greedyChat(shared + 'Question two?', 20));
  assert.ok(other.usage.prompt_tokens_details.cached_tokens >= 64);
  const after = (await metrics(REAL)).get('prefix_cache_hit_tokens_total');
  assert.ok(after > before);
  // Cold reference on the other server (its cache has never seen this prompt).
  const cold = await smallkv().chat.completions.create(greedyChat(shared + 'Question two?', 20));
  assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(text(other), text(cold));
});

test('a tiny --kv-memory forces preemption; every request completes unchanged', async () => {
  const c = smallkv();
  const want = await Promise.all(prompts.map((p) => real().chat.completions.create(greedyChat(p, 48))));
  const before = (await metrics(SMALLKV)).get('num_preemptions_total');
  const got = await Promise.all(prompts.map((p) => c.chat.completions.create(greedyChat(p, 48))));
  for (const r of got) {
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 48);
  }
  assert.deepEqual(got.map(text), want.map(text));
  const m = await waitIdle(SMALLKV);
  assert.ok(m.get('num_preemptions_total') > before, 'expected preemptions with a 300 KiB budget');
});
