// Shared by the *.test.mjs files: clients for the servers run_node_tests.sh started, and
// small readers for /metrics and /proc.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

export const REAL = process.env.DSV4_REAL_URL;
export const FAKE = process.env.DSV4_FAKE_URL;
export const SMALLKV = process.env.DSV4_SMALLKV_URL;
export const SPEC = process.env.DSV4_SPEC_URL;
export const API_KEY = 'test-key';

export function client(base, apiKey = 'none') {
  return new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
}

export const real = () => client(REAL, API_KEY);
export const fake = () => client(FAKE);
export const smallkv = () => client(SMALLKV);

// Greedy, chat mode, fixed length: deterministic on the tiny random model.
export function greedyChat(content, max_tokens = 16) {
  return {
    model: 'tiny',
    messages: [{ role: 'user', content }],
    max_tokens,
    temperature: 0,
    ignore_eos: true,
    thinking: { type: 'disabled' },
  };
}

export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const get = (name) => {
    const line = text.split('\n').find((l) => l.startsWith(`dsv4:${name}{`));
    return line === undefined ? undefined : Number(line.split(' ').pop());
  };
  return { text, get };
}

export function rssKiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Waits until the engine has nothing running or queued (bounded).
export async function waitIdle(base, ms = 30_000) {
  const end = Date.now() + ms;
  for (;;) {
    const m = await metrics(base);
    if (m.get('num_requests_running') === 0 && m.get('num_requests_waiting') === 0) return m;
    if (Date.now() > end) throw new Error(`engine not idle after ${ms} ms:\n${m.text}`);
    await sleep(50);
  }
}
