// Tool calls and reasoning end to end through the server, on the test-only scripted backend
// (--fake-output-file fake_outputs.json): the scripted DeepSeek-V4 output runs through the
// real engine, tokenizer, detokenizer and DSML/reasoning parser.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { fake } from './helpers.mjs';

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get current weather for a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, unit: { type: 'string' }, days: { type: 'integer' } },
        required: ['city'],
      },
    },
  },
];
const ask = [{ role: 'user', content: "What's the weather in Paris?" }];

async function collect(stream) {
  const out = { reasoning: '', content: '', calls: [], finish: null, usage: null };
  for await (const ch of stream) {
    if (ch.usage) out.usage = ch.usage;
    if (!ch.choices.length) continue;
    const d = ch.choices[0].delta;
    if (d.reasoning_content) out.reasoning += d.reasoning_content;
    if (d.content) out.content += d.content;
    for (const tc of d.tool_calls ?? []) {
      if (tc.id) out.calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
      out.calls[tc.index].arguments += tc.function.arguments ?? '';
    }
    if (ch.choices[0].finish_reason) out.finish = ch.choices[0].finish_reason;
  }
  return out;
}

test('tool calls round trip: call → tool result → answer', async () => {
  const c = fake();
  const r = await c.chat.completions.create({ model: 'fake', messages: ask, tools });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.reasoning_content, 'The user wants Paris and London weather. I will call get_weather twice.');
  assert.equal(m.content, 'Let me look that up.');
  assert.equal(m.tool_calls.length, 2);
  assert.match(m.tool_calls[0].id, /^call_[0-9a-f]{24}$/);
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', unit: 'celsius', days: 2 });
  assert.equal(m.tool_calls[1].function.arguments, '{"city": "London"}');
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens);

  // Send the calls back with their results; the model (script) answers.
  const history = [
    ...ask,
    { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls },
    { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temp_c": 18, "condition": "cloudy"}' },
    { role: 'tool', tool_call_id: m.tool_calls[1].id, content: '{"temp_c": 15, "condition": "rain"}' },
  ];
  const a = await c.chat.completions.create({ model: 'fake', messages: history, tools });
  assert.equal(a.choices[0].finish_reason, 'stop');
  assert.equal(a.choices[0].message.content, 'It is 18 °C and cloudy in Paris right now.');
  assert.equal(a.choices[0].message.reasoning_content, 'The tool says 18 C and cloudy.');
  assert.equal(a.choices[0].message.tool_calls, undefined);
  // With tools the prompt is append-only, so the second request reuses the first's prefix.
  assert.ok(a.usage.prompt_tokens > r.usage.prompt_tokens);
});

test('streamed tool calls concatenate to the non-streamed ones', async () => {
  const c = fake();
  const whole = (await c.chat.completions.create({ model: 'fake', messages: ask, tools })).choices[0].message;
  const s = await collect(
    await c.chat.completions.create({ model: 'fake', messages: ask, tools, stream: true, stream_options: { include_usage: true } }),
  );
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.reasoning, whole.reasoning_content);
  assert.equal(s.content, whole.content);
  assert.deepEqual(
    s.calls.map((x) => [x.name, x.arguments]),
    whole.tool_calls.map((x) => [x.function.name, x.function.arguments]),
  );
  for (const x of s.calls) assert.match(x.id, /^call_[0-9a-f]{24}$/);
  assert.ok(s.usage.completion_tokens_details.reasoning_tokens > 0);
});

test('reasoning is split from content; thinking off leaves no reasoning', async () => {
  const c = fake();
  const q = [{ role: 'user', content: 'What is 2+2?' }];
  const r = await c.chat.completions.create({ model: 'fake', messages: q });
  assert.equal(r.choices[0].message.reasoning_content, 'Two plus two: add them.\nThe sum is 4.');
  assert.equal(r.choices[0].message.content, 'The answer is 4.');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collect(await c.chat.completions.create({ model: 'fake', messages: q, stream: true }));
  assert.equal(s.reasoning, r.choices[0].message.reasoning_content);
  assert.equal(s.content, 'The answer is 4.');
  // include_reasoning=false hides it but still strips it from content.
  const hidden = await c.chat.completions.create({ model: 'fake', messages: q, include_reasoning: false });
  assert.equal(hidden.choices[0].message.reasoning_content, null);
  assert.equal(hidden.choices[0].message.content, 'The answer is 4.');
});

test('tool_choice: none strips calls, named forces the call in chat mode, required needs chat mode', async () => {
  const c = fake();
  const chatMode = { thinking: { type: 'disabled' } };
  const q = [{ role: 'user', content: 'Weather in chat mode, please' }];
  const auto = await c.chat.completions.create({ model: 'fake', messages: q, tools, ...chatMode });
  assert.equal(auto.choices[0].message.content, null);
  assert.equal(auto.choices[0].message.tool_calls[0].function.arguments, '{"city": "Oslo"}');
  const none = await c.chat.completions.create({ model: 'fake', messages: q, tools, tool_choice: 'none', ...chatMode });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.choices[0].finish_reason, 'stop');

  const named = { type: 'function', function: { name: 'get_weather' } };
  const f = await c.chat.completions.create({ model: 'fake', messages: ask, tools, tool_choice: named, ...chatMode });
  assert.equal(f.choices[0].finish_reason, 'tool_calls');
  assert.equal(f.choices[0].message.tool_calls.length, 1);
  assert.equal(f.choices[0].message.tool_calls[0].function.name, 'get_weather');
  assert.equal(f.choices[0].message.tool_calls[0].function.arguments, '{"city": "Rome"}');
  const fs = await collect(
    await c.chat.completions.create({ model: 'fake', messages: ask, tools, tool_choice: named, stream: true, ...chatMode }),
  );
  assert.deepEqual(fs.calls.map((x) => x.arguments), ['{"city": "Rome"}']);

  await assert.rejects(c.chat.completions.create({ model: 'fake', messages: ask, tools, tool_choice: 'required' }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.match(e.message, /thinking/);
    return true;
  });
  await assert.rejects(
    c.chat.completions.create({ model: 'fake', messages: ask, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    OpenAI.BadRequestError,
  );
  await assert.rejects(
    c.chat.completions.create({ model: 'fake', messages: ask, tools: [{ type: 'code_interpreter' }] }),
    OpenAI.BadRequestError,
  );
});

test('parallel_tool_calls=false keeps the first call', async () => {
  const r = await fake().chat.completions.create({ model: 'fake', messages: ask, tools, parallel_tool_calls: false });
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  assert.equal(r.choices[0].message.tool_calls[0].function.arguments, '{"city": "Paris", "unit": "celsius", "days": 2}');
});
