// Logprobs through the server path on the tiny model: the response carries exactly the
// engine's per-token logprobs and alternatives (OpenAI chat shape and the legacy completions
// shape), and the streamed chunks concatenate to the non-streamed list.
#include <gtest/gtest.h>

#include <sstream>

#include "model/model.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "server/generation.h"
#include "server/request_parse.h"
#include "server/response_builder.h"

namespace dsv4 {
namespace {

const std::string kDir = std::string(DSV4_SOURCE_DIR) + "/models/tiny";

const Tokenizer& tok() {
  static Tokenizer t = Tokenizer::from_file(kDir + "/tokenizer.json");
  return t;
}

struct Tiny {
  Model model{load_weights(kDir)};
  CpuBackend backend{model};
  Engine engine{backend, EngineOptions{}};
  TokenMap map{model.config().vocab_size};
  Tiny() { engine.start(); }
};

Tiny& tiny() {
  static Tiny t;
  return t;
}

ApiConfig api() {
  ApiConfig a;
  a.served_model_name = "tiny";
  a.max_model_len = tiny().engine.max_model_len();
  return a;
}

std::string text_of(int32_t id) {
  const auto t = static_cast<TokenId>(id);
  return tok().decode(std::span<const TokenId>(&t, 1));
}

// The engine's own events for the plan, bypassing the server.
std::vector<TokenEvent> engine_events(const GenerationPlan& p) {
  EventQueue q;
  Request r;
  for (int32_t id : p.prompt) r.prompt.push_back(tiny().map.to_engine(id));
  r.sampling = p.sampling;
  r.stop = p.stop;
  r.on_event = q.callback();
  tiny().engine.submit(std::move(r));
  std::vector<TokenEvent> out;
  for (TokenEvent e = q.pop();; e = q.pop()) {
    if (e.token >= 0) out.push_back(e);
    if (e.finish != FinishReason::None) break;
  }
  return out;
}

ojson non_streamed(const GenerationPlan& p) {
  Generation g(tiny().engine, tok(), p, tiny().map, nullptr);
  ResponseBuilder b(p.chat, "tiny", true);
  std::vector<OutputDelta> d;
  bool fin = false;
  while (!fin) {
    fin = g.poll(std::chrono::milliseconds(1000), d);
    b.add(d, g.take_logprobs());
    d.clear();
  }
  return b.final_response(g.summary());
}

// The choices of every SSE chunk, in order.
std::vector<ojson> streamed(const GenerationPlan& p) {
  Generation g(tiny().engine, tok(), p, tiny().map, nullptr);
  ResponseBuilder b(p.chat, "tiny", true);
  std::string sse = b.stream_open();
  std::vector<OutputDelta> d;
  bool fin = false;
  while (!fin) {
    fin = g.poll(std::chrono::milliseconds(1000), d);
    sse += b.stream_deltas(d, g.take_logprobs());
    d.clear();
  }
  sse += b.stream_close(g.summary(), false);
  std::vector<ojson> choices;
  std::istringstream in(sse);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const ojson chunk = parse_json_ordered(line.substr(6));
    for (const ojson& c : chunk["choices"]) choices.push_back(c);
  }
  return choices;
}

ojson chat_body(int top) {
  return {{"model", "tiny"},
          {"messages", ojson::array({{{"role", "user"}, {"content", "Tell me a story"}}})},
          {"thinking", {{"type", "disabled"}}},
          {"temperature", 0},
          {"max_tokens", 12},
          {"logprobs", true},
          {"top_logprobs", top}};
}

TEST(server_logprobs, ChatCarriesTheEngineLogprobs) {
  const GenerationPlan p = parse_chat_request(chat_body(3), api(), tok());
  const std::vector<TokenEvent> ref = engine_events(p);
  ASSERT_FALSE(ref.empty());
  const ojson r = non_streamed(p);
  const ojson& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const ojson& c = content[i];
    EXPECT_EQ(c["token"], text_of(ref[i].token));
    EXPECT_EQ(c["logprob"].get<double>(), static_cast<double>(ref[i].logprob));
    const std::string s = c["token"].get<std::string>();
    ASSERT_EQ(c["bytes"].size(), s.size());
    for (size_t k = 0; k < s.size(); ++k) EXPECT_EQ(c["bytes"][k].get<int>(), static_cast<unsigned char>(s[k]));
    ASSERT_EQ(c["top_logprobs"].size(), 3u);
    ASSERT_EQ(ref[i].top_logprobs.size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(c["top_logprobs"][k]["token"], text_of(ref[i].top_logprobs[k].token));
      EXPECT_EQ(c["top_logprobs"][k]["logprob"].get<double>(), static_cast<double>(ref[i].top_logprobs[k].logprob));
    }
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(c["logprob"], c["top_logprobs"][0]["logprob"]);
  }
}

TEST(server_logprobs, ChatStreamedEqualsNonStreamed) {
  const GenerationPlan p = parse_chat_request(chat_body(2), api(), tok());
  const ojson whole = non_streamed(p)["choices"][0]["logprobs"]["content"];
  ojson joined = ojson::array();
  for (const ojson& c : streamed(p))
    if (!c["logprobs"].is_null())
      for (const ojson& x : c["logprobs"]["content"]) joined.push_back(x);
  ASSERT_FALSE(whole.empty());
  EXPECT_EQ(joined, whole);
}

TEST(server_logprobs, ChatWithoutLogprobsSendsNull) {
  ojson b = chat_body(0);
  b.erase("logprobs");
  b.erase("top_logprobs");
  const GenerationPlan p = parse_chat_request(b, api(), tok());
  Generation g(tiny().engine, tok(), p, tiny().map, nullptr);
  ResponseBuilder rb(true, "tiny", p.sampling.logprobs);
  std::vector<OutputDelta> d;
  while (!g.poll(std::chrono::milliseconds(1000), d)) rb.add(d, g.take_logprobs());
  rb.add(d, g.take_logprobs());
  EXPECT_TRUE(rb.final_response(g.summary())["choices"][0]["logprobs"].is_null());
}

TEST(server_logprobs, CompletionsUseTheLegacyShape) {
  const GenerationPlan p = parse_completion_request(
      {{"model", "tiny"}, {"prompt", "Once upon"}, {"temperature", 0}, {"max_tokens", 10}, {"logprobs", 2}}, api(), tok());
  const std::vector<TokenEvent> ref = engine_events(p);
  const ojson lp = non_streamed(p)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ref.size());
  ASSERT_EQ(lp["token_logprobs"].size(), ref.size());
  ASSERT_EQ(lp["top_logprobs"].size(), ref.size());
  ASSERT_EQ(lp["text_offset"].size(), ref.size());
  int64_t offset = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], text_of(ref[i].token));
    EXPECT_EQ(lp["token_logprobs"][i].get<double>(), static_cast<double>(ref[i].logprob));
    EXPECT_EQ(lp["text_offset"][i].get<int64_t>(), offset);
    for (unsigned char ch : lp["tokens"][i].get<std::string>()) offset += (ch & 0xC0) != 0x80;  // code points
    const ojson& top = lp["top_logprobs"][i];
    ASSERT_GE(top.size(), 1u);
    ASSERT_LE(top.size(), 2u);
    const std::string first = text_of(ref[i].top_logprobs[0].token);
    EXPECT_EQ(top[first].get<double>(), static_cast<double>(ref[i].top_logprobs[0].logprob));
  }
  // Streamed: the lists continue across chunks (offsets included).
  ojson tokens = ojson::array(), offsets = ojson::array();
  for (const ojson& c : streamed(p)) {
    if (c["logprobs"].is_null()) continue;
    for (const ojson& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const ojson& o : c["logprobs"]["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
}

}  // namespace
}  // namespace dsv4
