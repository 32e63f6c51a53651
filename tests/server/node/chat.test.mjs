// The official openai SDK against `dsv4 serve models/tiny`: chat (non-streaming and
// streaming), reasoning on/off, completions, models, and errors as the SDK's typed errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { REAL, API_KEY, real, client, greedyChat } from './helpers.mjs';

test('chat non-streaming: message, finish_reason, usage', async () => {
  const r = await real().chat.completions.create(greedyChat('Hello there', 12));
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'tiny');
  assert.match(r.id, /^chatcmpl-/);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0);
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 0);
  // Greedy is deterministic.
  const again = await real().chat.completions.create(greedyChat('Hello there', 12));
  assert.equal(again.choices[0].message.content, c.message.content);
});

test('chat streaming equals non-streaming, with include_usage', async () => {
  const body = greedyChat('Stream me something', 10);
  const whole = await real().chat.completions.create(body);
  const stream = await real().chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let roles = 0;
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const ch of stream) {
    chunks++;
    assert.equal(ch.object, 'chat.completion.chunk');
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length === 0) continue;
    const d = ch.choices[0].delta;
    if (d.role) roles++;
    if (d.content) text += d.content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.ok(chunks >= 3);
  assert.equal(roles, 1);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('reasoning on/off: thinking mode output goes to reasoning_content', async () => {
  const base = { model: 'tiny', messages: [{ role: 'user', content: 'Think first' }], max_tokens: 8, ignore_eos: true };
  // The tiny random model never writes </think>, so in thinking mode all of it is reasoning.
  const on = await real().chat.completions.create({ ...base, temperature: 0, deepseek_v4_sampling_override: false });
  assert.ok(on.choices[0].message.reasoning_content.length > 0);
  assert.equal(on.choices[0].message.content, '');
  assert.equal(on.usage.completion_tokens_details.reasoning_tokens, 8);
  const off = await real().chat.completions.create({ ...base, temperature: 0, thinking: { type: 'disabled' } });
  assert.equal(off.choices[0].message.reasoning_content, null);
  assert.ok(off.choices[0].message.content.length > 0);
  assert.equal(off.usage.completion_tokens_details.reasoning_tokens, 0);
  // Other switches: chat_template_kwargs and reasoning_effort "none".
  const kw = await real().chat.completions.create({ ...base, temperature: 0, chat_template_kwargs: { thinking: false } });
  assert.equal(kw.choices[0].message.content, off.choices[0].message.content);
  const none = await real().chat.completions.create({ ...base, temperature: 0, reasoning_effort: 'none' });
  assert.equal(none.choices[0].message.content, off.choices[0].message.content);
});

test('completions: string and token-id prompts, streaming', async () => {
  const c = real();
  const r = await c.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 6, temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.completion_tokens, 6);
  const ids = await c.completions.create({ model: 'tiny', prompt: [5, 9, 23, 40], max_tokens: 5, temperature: 0, ignore_eos: true });
  assert.equal(ids.usage.prompt_tokens, 4);
  const s = await c.completions.create({ model: 'tiny', prompt: [5, 9, 23, 40], max_tokens: 5, temperature: 0, ignore_eos: true, stream: true });
  let text = '';
  for await (const ch of s) if (ch.choices.length) text += ch.choices[0].text;
  assert.equal(text, ids.choices[0].text);
});

test('models and health', async () => {
  const list = await real().models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['tiny']);
  const h = await fetch(`${REAL}/health`);
  assert.equal(h.status, 200);
});

test('errors surface as the SDK typed errors', async () => {
  const c = real();
  await assert.rejects(c.chat.completions.create({ ...greedyChat('x'), temperature: 5 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, 'temperature');
    assert.equal(e.type, 'invalid_request_error');
    return true;
  });
  await assert.rejects(c.chat.completions.create({ ...greedyChat('x'), model: 'gpt-9' }), OpenAI.NotFoundError);
  await assert.rejects(client(REAL, 'wrong-key').chat.completions.create(greedyChat('x')), OpenAI.AuthenticationError);
  await assert.rejects(client(REAL, 'wrong-key').models.list(), OpenAI.AuthenticationError);
  await assert.rejects(c.chat.completions.create({ ...greedyChat('x'), n: 2 }), OpenAI.BadRequestError);
  await assert.rejects(c.completions.create({ model: 'tiny', prompt: 'x', best_of: 2 }), OpenAI.BadRequestError);
  await assert.rejects(c.chat.completions.create({ ...greedyChat('x'), top_p: 0 }), OpenAI.BadRequestError);
  await assert.rejects(c.chat.completions.create({ ...greedyChat('x'), max_tokens: 'many' }), OpenAI.BadRequestError);
  await assert.rejects(c.chat.completions.create({ model: 'tiny', messages: [] }), OpenAI.BadRequestError);
  const long = 'word '.repeat(3000);
  await assert.rejects(c.chat.completions.create(greedyChat(long)), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.code, 'context_length_exceeded');
    return true;
  });
  await assert.rejects(c.chat.completions.create({ ...greedyChat('x'), max_tokens: 5000 }), OpenAI.BadRequestError);
});

test('malformed bodies get OpenAI-shaped 4xx JSON', async () => {
  const post = (path, body, headers = {}) =>
    fetch(`${REAL}${path}`, {
      method: 'POST',
      body,
      headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}`, ...headers },
    });
  for (const body of ['{"model": "tiny", "messages": [', 'null', '[1,2]', '"str"', '', '{"model": 5}']) {
    const r = await post('/v1/chat/completions', body);
    assert.equal(r.status, 400, body);
    const j = await r.json();
    assert.equal(typeof j.error.message, 'string');
    assert.ok('type' in j.error && 'param' in j.error && 'code' in j.error);
  }
  const noKey = await fetch(`${REAL}/v1/models`);
  assert.equal(noKey.status, 401);
  assert.equal((await noKey.json()).error.code, 'invalid_api_key');
  const missing = await post('/v1/nothing', '{}');
  assert.equal(missing.status, 404);
  assert.ok((await missing.json()).error.message.includes('/v1/nothing'));
});
