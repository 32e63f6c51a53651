// --speculative-tokens 2 (MTP drafts on the CPU backend): greedy output is the same as the
// plain server's, and /metrics counts the drafts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, real, greedyChat, metrics, SPEC } from './helpers.mjs';

test('speculative decoding keeps greedy output and exports its counters', async () => {
  for (const prompt of ['Hello there', 'Count to ten']) {
    const want = await real().chat.completions.create(greedyChat(prompt, 24));
    const got = await client(SPEC).chat.completions.create(greedyChat(prompt, 24));
    assert.equal(got.choices[0].message.content, want.choices[0].message.content);
    assert.equal(got.usage.completion_tokens, 24);
  }
  const m = await metrics(SPEC);
  assert.ok(m.get('spec_decode_num_draft_tokens_total') > 0, m.text);
  assert.ok(m.get('spec_decode_num_accepted_tokens_total') >= 0);
  assert.ok(m.get('spec_decode_num_accepted_tokens_total') <= m.get('spec_decode_num_draft_tokens_total'));
  assert.equal((await metrics(process.env.DSV4_REAL_URL)).get('spec_decode_num_draft_tokens_total'), 0);
});
