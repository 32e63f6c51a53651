// The serving engine on the shipped tiny model: continuous batching, chunked prefill,
// preemption, cancellation, prefix caching, seeded sampling and stop conditions, all checked
// against each request run alone on a bare Model.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"

namespace dsv4 {
namespace {

Model& tiny() {
  static Model m(load_weights(std::string(DSV4_SOURCE_DIR) + "/models/tiny"));
  return m;
}

std::vector<int32_t> prompt_of(int64_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(2 + (i * 131 + salt * 17 + i * i * 7) % 509));
  return p;
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // the row each token was sampled from
  std::string text;
  FinishReason finish = FinishReason::None;
  TokenEvent last;
};

// Reference: the request alone on a bare Model, whole prompt at once, then one token per call.
SamplingParams greedy();
Output run_alone(const std::vector<int32_t>& prompt, int64_t max_tokens, const SamplingParams& sp = greedy()) {
  Model& m = tiny();
  SequenceState st = m.new_sequence();
  TokenHistory h(m.config().vocab_size, prompt);
  Output o;
  std::vector<int32_t> feed = prompt;
  for (int64_t s = 0; s < max_tokens; ++s) {
    SequenceChunk c{&st, feed};
    std::vector<float> l = m.forward(std::span<const SequenceChunk>(&c, 1), false);
    SampleResult r = sample_next(l, sp, h, sp.seed.value_or(0), static_cast<uint64_t>(s));
    h.add_generated(r.token);
    o.tokens.push_back(r.token);
    o.logits.push_back(std::move(l));
    feed = {r.token};
  }
  o.finish = FinishReason::Length;
  return o;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

Request make_request(std::vector<int32_t> prompt, int64_t max_tokens, Output* out, SamplingParams sp = greedy()) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling = sp;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  r.on_event = [out](const TokenEvent& e) {
    if (e.token >= 0) out->tokens.push_back(e.token);
    out->text += e.text;
    if (e.finish != FinishReason::None) {
      out->finish = e.finish;
      out->last = e;
    }
  };
  r.on_logits = [out](std::span<const float> l) { out->logits.emplace_back(l.begin(), l.end()); };
  return r;
}

EngineOptions options(int64_t max_batch, int64_t step_tokens, int64_t chunk, bool cache = false) {
  EngineOptions o;
  o.kv_memory_bytes = size_t{64} << 20;
  o.limits = {max_batch, step_tokens, chunk};
  o.prefix_cache = cache;
  o.prefix_block = 8;
  return o;
}

struct Case {
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

std::vector<Case> mixed_cases() {
  std::vector<Case> cs;
  const int64_t lens[] = {1, 5, 12, 17, 23, 31, 40, 8, 2, 36};
  for (int i = 0; i < 10; ++i) cs.push_back({prompt_of(lens[i], i), 3 + (i * 5) % 11});
  return cs;
}

TEST(Engine, ConcurrentGreedyEqualsEachAloneBitwise) {
  const std::vector<Case> cs = mixed_cases();
  std::vector<Output> ref;
  for (const auto& c : cs) ref.push_back(run_alone(c.prompt, c.max_tokens));
  struct Cfg {
    int64_t batch, step, chunk;
  };
  for (Cfg cfg : {Cfg{1, 512, 0}, Cfg{3, 16, 5}, Cfg{8, 64, 16}, Cfg{8, 7, 0}, Cfg{5, 512, 3}}) {
    CpuBackend be(tiny());
    Engine eng(be, options(cfg.batch, cfg.step, cfg.chunk));
    std::vector<Output> out(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) eng.submit(make_request(cs[i].prompt, cs[i].max_tokens, &out[i]));
    const auto t0 = std::chrono::steady_clock::now();
    eng.run_until_idle();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const EngineStats st = eng.stats();
    std::printf("engine tiny: max_batch %ld step %ld chunk %ld: %ld steps, %ld prompt + %ld generated tokens, %.0f tok/s\n",
                long(cfg.batch), long(cfg.step), long(cfg.chunk), long(st.steps), long(st.prompt_tokens),
                long(st.generated_tokens), double(st.prompt_tokens + st.generated_tokens) / secs);
    for (size_t i = 0; i < cs.size(); ++i) {
      SCOPED_TRACE("batch " + std::to_string(cfg.batch) + " step " + std::to_string(cfg.step) + " chunk " +
                   std::to_string(cfg.chunk) + " request " + std::to_string(i));
      EXPECT_EQ(out[i].tokens, ref[i].tokens);
      EXPECT_EQ(out[i].logits, ref[i].logits);  // batch composition and chunking change no bit
      EXPECT_EQ(out[i].finish, FinishReason::Length);
      EXPECT_EQ(out[i].last.generated_tokens, cs[i].max_tokens);
      EXPECT_EQ(out[i].last.prompt_tokens, static_cast<int64_t>(cs[i].prompt.size()));
    }
    EXPECT_EQ(eng.budget().used(), 0u);
    EXPECT_EQ(eng.stats().finished, static_cast<int64_t>(cs.size()));
  }
}

TEST(Engine, PrefixCacheHitsGiveIdenticalLogits) {
  const std::vector<int32_t> a = prompt_of(30, 1);
  std::vector<int32_t> b(a.begin(), a.begin() + 20), c = a;
  for (int32_t t : prompt_of(9, 5)) b.push_back(t);
  std::vector<int32_t> d(a.begin(), a.begin() + 8);  // a prefix of exactly one block
  d.push_back(77);
  CpuBackend be(tiny());
  Engine eng(be, options(4, 64, 0, true));
  Output oa, ob, oc, od;
  eng.submit(make_request(a, 6, &oa));
  eng.run_until_idle();
  EXPECT_EQ(oa.last.cached_tokens, 0);
  EXPECT_GT(eng.stats().prefix_cache_entries, 0);
  eng.submit(make_request(b, 6, &ob));
  eng.submit(make_request(c, 6, &oc));
  eng.submit(make_request(d, 6, &od));
  eng.run_until_idle();
  EXPECT_EQ(ob.last.cached_tokens, 16);  // blocks of 8 shared with a
  EXPECT_EQ(oc.last.cached_tokens, 24);  // the longest block prefix leaving a token to prefill
  EXPECT_EQ(od.last.cached_tokens, 8);
  EXPECT_EQ(eng.stats().prefix_hit_tokens, 48);
  for (auto [prompt, out] : {std::pair{&a, &oa}, {&b, &ob}, {&c, &oc}, {&d, &od}}) {
    Output ref = run_alone(*prompt, 6);
    EXPECT_EQ(out->tokens, ref.tokens);
    EXPECT_EQ(out->logits, ref.logits);  // bitwise
  }
  // Only the cache holds memory when idle.
  EXPECT_EQ(eng.budget().used(), eng.stats().prefix_cache_bytes);
}

TEST(Engine, TinyBudgetPreemptsAndStillMatches) {
  const std::vector<Case> cs = mixed_cases();
  CpuBackend be(tiny());
  EngineOptions o = options(8, 64, 8, true);
  // One entry per page, room for the largest request plus two short ones: admitted requests
  // must be preempted as they grow.
  o.page_entries = 1;
  const KvBudget probe(state_costs(tiny().config()), size_t{64} << 20, o.page_entries);
  o.kv_memory_bytes = probe.bytes_for(60) + 2 * probe.bytes_for(8);
  Engine eng(be, o);
  std::vector<Output> out(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) eng.submit(make_request(cs[i].prompt, cs[i].max_tokens, &out[i]));
  int64_t peak = 0;
  while (eng.step()) {
    EXPECT_LE(eng.budget().used(), eng.budget().budget());
    peak = std::max(peak, eng.stats().running);
  }
  EXPECT_GT(eng.stats().preemptions, 0);
  EXPECT_GT(peak, 1);
  for (size_t i = 0; i < cs.size(); ++i) {
    Output ref = run_alone(cs[i].prompt, cs[i].max_tokens);
    EXPECT_EQ(out[i].tokens, ref.tokens) << "request " << i;
    EXPECT_EQ(out[i].finish, FinishReason::Length);
  }
  EXPECT_EQ(eng.budget().used(), eng.stats().prefix_cache_bytes);
}

TEST(Engine, SeededSamplingIsIndependentOfBatchComposition) {
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_p = 0.95f;
  sp.top_k = 50;
  sp.frequency_penalty = 0.3f;
  sp.seed = 1234;
  const std::vector<int32_t> prompt = prompt_of(13, 3);
  const Output ref = run_alone(prompt, 12, sp);
  SamplingParams other = sp;
  other.seed = 99;
  EXPECT_NE(run_alone(prompt, 12, other).tokens, ref.tokens);  // the seed matters
  for (int64_t batch : {1, 2, 6}) {
    CpuBackend be(tiny());
    EngineOptions o = options(batch, 9, 4);
    if (batch == 6) {  // and with preemption
      o.page_entries = 1;
      const KvBudget probe(state_costs(tiny().config()), size_t{64} << 20, o.page_entries);
      o.kv_memory_bytes = probe.bytes_for(40) + probe.bytes_for(0);  // two fit, not grown
    }
    Engine eng(be, o);
    std::vector<Output> noise(5);
    Output mine;
    for (int i = 0; i < 3; ++i) {
      SamplingParams ns = sp;
      ns.seed = 7 + i;
      eng.submit(make_request(prompt_of(5 + 9 * i, 10 + i), 10, &noise[i], ns));
    }
    eng.submit(make_request(prompt, 12, &mine, sp));
    for (int i = 3; i < 5; ++i) eng.submit(make_request(prompt_of(3 + 4 * i, 20 + i), 8, &noise[i]));
    eng.run_until_idle();
    EXPECT_EQ(mine.tokens, ref.tokens) << "max_batch " << batch;
    if (batch == 6) {
      EXPECT_GT(eng.stats().preemptions, 0);
    }
  }
}

// Token t reads as "<t>": stop strings then span token boundaries.
TextHook angle_detok() {
  return {[](int32_t t) { return "<" + std::to_string(t) + ">"; }, [] { return std::string(); }};
}

TEST(Engine, StopStringsAcrossTokensAndStopTokens) {
  const std::vector<int32_t> prompt = prompt_of(9, 4);
  const Output ref = run_alone(prompt, 12);
  std::vector<std::string> texts;
  std::string full;
  for (int32_t t : ref.tokens) full += (texts.emplace_back("<" + std::to_string(t) + ">"));
  // From the middle of token 2's text into token 3's.
  const std::string stop = texts[2].substr(texts[2].size() - 2) + texts[3].substr(0, 2);
  const size_t at = full.find(stop);
  size_t completes = 0, len = 0;  // tokens needed until the stop string is complete
  while (len < at + stop.size()) len += texts[completes++].size();

  for (bool include : {false, true}) {
    CpuBackend be(tiny());
    Engine eng(be, options(2, 64, 0));
    Output o, other;
    Request r = make_request(prompt, 12, &o);
    r.detokenize = angle_detok();
    r.stop.stop_strings = {"never-there", stop};
    r.stop.include_stop_str_in_output = include;
    eng.submit(std::move(r));
    eng.submit(make_request(prompt_of(4, 1), 12, &other));
    eng.run_until_idle();
    EXPECT_EQ(o.finish, FinishReason::Stop);
    EXPECT_EQ(o.last.stop_string, stop);
    EXPECT_EQ(o.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + completes));
    EXPECT_EQ(o.text, full.substr(0, at + (include ? stop.size() : 0)));
    EXPECT_EQ(other.tokens.size(), 12u);
  }
  {  // a stop token id: excluded from the text, reported
    CpuBackend be(tiny());
    Engine eng(be, options(2, 64, 0));
    Output o;
    Request r = make_request(prompt, 12, &o);
    r.detokenize = angle_detok();
    r.stop.stop_token_ids = {ref.tokens[4]};
    eng.submit(std::move(r));
    eng.run_until_idle();
    const size_t first = std::find(ref.tokens.begin(), ref.tokens.end(), ref.tokens[4]) - ref.tokens.begin();
    EXPECT_EQ(o.finish, FinishReason::Stop);
    EXPECT_EQ(o.last.stop_token, ref.tokens[4]);
    EXPECT_EQ(o.tokens.size(), first + 1);
    std::string want;
    for (size_t i = 0; i < first; ++i) want += texts[i];
    EXPECT_EQ(o.text, want);
  }
  {  // without a stop, the text is every token's
    CpuBackend be(tiny());
    Engine eng(be, options(2, 64, 0));
    Output o;
    Request r = make_request(prompt, 12, &o);
    r.detokenize = angle_detok();
    eng.submit(std::move(r));
    eng.run_until_idle();
    EXPECT_EQ(o.text, full);
    EXPECT_EQ(o.finish, FinishReason::Length);
  }
}

TEST(Engine, CancellationFreesPagesFromAnotherThread) {
  CpuBackend be(tiny());
  Engine eng(be, options(2, 64, 0));
  eng.start();
  std::vector<EventQueue> qs(3);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.prompt = prompt_of(10 + i, i);
    r.sampling = greedy();
    r.stop.max_tokens = 500;
    r.stop.ignore_eos = true;
    r.on_event = qs[i].callback();
    ids.push_back(eng.submit(std::move(r)));
  }
  // Requests 0 and 1 run (max_batch 2); 2 waits. Cancel 2 while queued, 0 mid-generation.
  for (int k = 0; k < 3; ++k) EXPECT_EQ(qs[0].pop().finish, FinishReason::None);
  EXPECT_GT(eng.budget().used(), 0u);
  eng.cancel(ids[2]);
  eng.cancel(ids[0]);
  TokenEvent e;
  do e = qs[0].pop(); while (e.finish == FinishReason::None);
  EXPECT_EQ(e.finish, FinishReason::Cancelled);
  EXPECT_GE(e.generated_tokens, 3);
  e = qs[2].pop();
  EXPECT_EQ(e.finish, FinishReason::Cancelled);
  EXPECT_EQ(e.generated_tokens, 0);
  // Only request 1 holds pages now.
  const size_t one = eng.budget().used();
  EXPECT_LE(one, eng.budget().bytes_for(11 + 500));
  eng.cancel(ids[1]);
  do e = qs[1].pop(); while (e.finish == FinishReason::None);
  EXPECT_EQ(e.finish, FinishReason::Cancelled);
  EXPECT_EQ(eng.budget().used(), 0u);  // back to idle
  eng.cancel(ids[1]);                  // already finished: no-op
  eng.cancel(12345);
  eng.stop();
  EXPECT_EQ(eng.stats().running, 0);
  EXPECT_EQ(eng.stats().waiting, 0);
}

TEST(Engine, SubmitFromManyThreadsMatchesAlone) {
  CpuBackend be(tiny());
  Engine eng(be, options(4, 32, 8, true));
  eng.start();
  const std::vector<Case> cs = mixed_cases();
  std::vector<Output> out(cs.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < cs.size(); ++i)
    th.emplace_back([&, i] {
      EventQueue q;
      Request r;
      r.prompt = cs[i].prompt;
      r.sampling = greedy();
      r.stop.max_tokens = cs[i].max_tokens;
      r.stop.ignore_eos = true;
      r.on_event = q.callback();
      eng.submit(std::move(r));
      for (;;) {
        TokenEvent e = q.pop();
        if (e.token >= 0) out[i].tokens.push_back(e.token);
        if (e.finish != FinishReason::None) break;
      }
    });
  for (auto& t : th) t.join();
  eng.stop();
  for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(out[i].tokens, run_alone(cs[i].prompt, cs[i].max_tokens).tokens);
}

TEST(Engine, StreamsLogprobsOfTheSampledToken) {
  CpuBackend be(tiny());
  Engine eng(be, options(2, 64, 0));
  SamplingParams sp = greedy();
  sp.logprobs = true;
  sp.top_logprobs = 3;
  Output o;
  std::vector<TokenEvent> evs;
  Request r = make_request(prompt_of(7, 2), 5, &o, sp);
  auto inner = r.on_event;
  r.on_event = [&](const TokenEvent& e) {
    evs.push_back(e);
    inner(e);
  };
  eng.submit(std::move(r));
  eng.run_until_idle();
  ASSERT_EQ(evs.size(), 5u);
  for (size_t i = 0; i < evs.size(); ++i) {
    std::vector<float> lp = log_softmax(o.logits[i]);
    EXPECT_EQ(evs[i].logprob, lp[evs[i].token]);
    ASSERT_EQ(evs[i].top_logprobs.size(), 3u);
    EXPECT_EQ(evs[i].top_logprobs[0].token, evs[i].token);  // greedy: the top token
    EXPECT_EQ(evs[i].top_logprobs[0].logprob, evs[i].logprob);
    EXPECT_GE(evs[i].top_logprobs[1].logprob, evs[i].top_logprobs[2].logprob);
  }
}

TEST(Engine, DefaultMaxTokensFillsTheContextAndEosStops) {
  CpuBackend be(tiny());
  EngineOptions o = options(2, 64, 0);
  o.max_model_len = 24;
  Engine eng(be, o);
  Output a;
  Request r = make_request(prompt_of(20, 2), -1, &a);
  eng.submit(std::move(r));
  eng.run_until_idle();
  EXPECT_EQ(a.tokens.size(), 4u);  // 24 - 20
  EXPECT_EQ(a.finish, FinishReason::Length);

  SamplingParams to_eos = greedy();
  to_eos.logit_bias = {{1, 100.0f}};  // EOS (id 1) wins every step
  for (bool ignore : {false, true}) {
    Output b;
    Request e = make_request(prompt_of(5, 2), 3, &b, to_eos);
    e.stop.ignore_eos = ignore;
    eng.submit(std::move(e));
    eng.run_until_idle();
    const std::vector<int32_t> want = ignore ? std::vector<int32_t>{1, 1, 1} : std::vector<int32_t>{1};
    EXPECT_EQ(b.tokens, want);
    EXPECT_EQ(b.finish, ignore ? FinishReason::Length : FinishReason::Stop);
    EXPECT_EQ(b.last.stop_token, ignore ? -1 : 1);
  }
}

TEST(Engine, BadRequestsAreClearErrors) {
  CpuBackend be(tiny());
  EngineOptions o = options(2, 64, 0);
  Engine eng(be, o);
  Output x;
  auto bad = [&](auto edit, const std::string& what) {
    Request r = make_request(prompt_of(4, 1), 4, &x);
    edit(r);
    try {
      eng.submit(std::move(r));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  bad([](Request& r) { r.prompt.clear(); }, "empty prompt");
  bad([](Request& r) { r.prompt[1] = static_cast<int32_t>(tiny().config().vocab_size); },
      "prompt token id " + std::to_string(tiny().config().vocab_size));
  bad([](Request& r) { r.stop.max_tokens = 0; }, "max_tokens");
  bad([](Request& r) { r.stop.max_tokens = 2000; }, "context limit of 1024");
  bad([](Request& r) { r.stop.stop_strings = {"x"}; }, "detokenizer hook");
  bad([](Request& r) { r.sampling.top_p = 2; }, "top_p");
  bad([](Request& r) { r.stop.stop_token_ids = {-1}; }, "stop token id");
  // A budget for 64 tokens: the context shrinks to fit, or an explicit one is refused.
  o.kv_memory_bytes = KvBudget(state_costs(tiny().config()), size_t{64} << 20, o.page_entries).bytes_for(64);
  Engine small(be, o);
  EXPECT_GE(small.max_model_len(), 64);
  EXPECT_LT(small.max_model_len(), 1024);
  EXPECT_NE(small.summary().find("max_model_len " + std::to_string(small.max_model_len())), std::string::npos);
  Request r = make_request(prompt_of(4, 1), 500, &x);
  EXPECT_THROW(small.submit(std::move(r)), Error);  // could never fit, even alone
  o.max_model_len = 1024;
  EXPECT_THROW(Engine(be, o), Error);
}

}  // namespace
}  // namespace dsv4
