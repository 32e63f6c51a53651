// Logprobs through the official SDK: chat's choices[].logprobs.content with the requested
// alternatives, valid log-probabilities, most likely first; the streamed chunks carry the same.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { real, greedyChat } from './helpers.mjs';

test('chat logprobs: true, top_logprobs: 3', async () => {
  const r = await real().chat.completions.create({ ...greedyChat('Say something', 8), logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const t of content) {
    assert.equal(typeof t.token, 'string');
    assert.deepEqual(t.bytes, [...Buffer.from(t.token, 'utf8')]);
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    for (let i = 0; i < 3; ++i) {
      assert.ok(t.top_logprobs[i].logprob <= 0);
      if (i > 0) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
    }
    assert.equal(t.logprob, t.top_logprobs[0].logprob);  // greedy picks the most likely
  }
  const stream = await real().chat.completions.create({
    ...greedyChat('Say something', 8), logprobs: true, top_logprobs: 3, stream: true,
  });
  const streamed = [];
  for await (const c of stream) for (const ch of c.choices) if (ch.logprobs) streamed.push(...ch.logprobs.content);
  assert.deepEqual(streamed, content);
});

test('top_logprobs without logprobs is a 400 naming it', async () => {
  await assert.rejects(real().chat.completions.create({ ...greedyChat('x', 2), top_logprobs: 2 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.param, 'top_logprobs');
    return true;
  });
});
