// The engine → parser path the server uses, on the test-only scripted backend: a scripted
// DeepSeek-V4 output (serving.md §10.2) comes back as reasoning, content and tool calls,
// identically whether requests run alone, batched, or preempted for lack of KV memory.
#include <gtest/gtest.h>

#include "io/config.h"
#include "server/generation.h"
#include "server/request_parse.h"
#include "server/response_builder.h"
#include "server/scripted_backend.h"

namespace dsv4 {
namespace {

const std::string kDir = std::string(DSV4_SOURCE_DIR) + "/models/tiny";

const Tokenizer& tok() {
  static Tokenizer t = Tokenizer::from_file(kDir + "/tokenizer.json");
  return t;
}

const std::string kOutput =
    "The user wants Paris weather.</think>Let me look that up.\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls><｜end▁of▁sentence｜>";

std::vector<ScriptEntry> script() {
  std::vector<ScriptEntry> s(2);
  s[0].when = "the weather";
  for (TokenId id : tok().encode(kOutput)) s[0].output.push_back(static_cast<int32_t>(id));
  s[1].when = "";
  for (TokenId id : tok().encode("plain answer")) s[1].output.push_back(static_cast<int32_t>(id));
  return s;
}

ApiConfig api() {
  ApiConfig a;
  a.served_model_name = "tiny";
  a.max_model_len = 1024;
  return a;
}

GenerationPlan weather_plan(const std::string& user) {
  ojson tools = ojson::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}}});
  return parse_chat_request({{"model", "tiny"},
                             {"messages", ojson::array({{{"role", "user"}, {"content", user}}})},
                             {"tools", tools}},
                            api(), tok());
}

ojson run(Engine& e, const GenerationPlan& p) {
  Generation g(e, tok(), p, TokenMap{static_cast<int64_t>(tok().vocab_size())}, nullptr);
  ResponseBuilder b(true, "tiny");
  std::vector<OutputDelta> d;
  while (!g.poll(std::chrono::milliseconds(1000), d)) {
    b.add(d);
    d.clear();
  }
  b.add(d);
  ojson r = b.final_response(g.summary());
  for (auto& c : r["choices"][0]["message"]["tool_calls"]) c.erase("id");  // random
  r.erase("id");
  r.erase("created");
  return r;
}

TEST(server_generation, ScriptedToolCallParsesEndToEnd) {
  ScriptedBackend be(load_config(kDir + "/config.json"), tok(), script());
  Engine e(be, EngineOptions{});
  e.start();
  const ojson r = run(e, weather_plan("What's the weather in Paris?"));
  const ojson& m = r["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "The user wants Paris weather.");
  EXPECT_EQ(m["content"], "Let me look that up.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\", \"days\": 2}");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  // Reasoning tokens: up to and including </think>.
  const int64_t think = static_cast<int64_t>(tok().encode("The user wants Paris weather.</think>").size());
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], think);
  EXPECT_EQ(r["usage"]["completion_tokens"], static_cast<int64_t>(tok().encode(kOutput).size()));

  const ojson plain = run(e, weather_plan("Say hello"));  // falls through to the "" entry
  EXPECT_EQ(plain["choices"][0]["message"]["reasoning_content"], "plain answer");  // no </think> in it
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
}

TEST(server_generation, BatchedAndPreemptedRunsMatchSoloRuns) {
  ScriptedBackend be(load_config(kDir + "/config.json"), tok(), script());
  std::vector<GenerationPlan> plans;
  for (int i = 0; i < 6; ++i) plans.push_back(weather_plan("the weather, case " + std::to_string(i)));
  const int64_t out_len = static_cast<int64_t>(tok().encode(kOutput).size()) + 4;
  int64_t need = 0;
  for (auto& p : plans) {
    p.stop.max_tokens = out_len;
    need = std::max(need, static_cast<int64_t>(p.prompt.size()) + out_len);
  }
  std::vector<ojson> solo;
  {
    Engine e(be, EngineOptions{});
    e.start();
    for (const auto& p : plans) solo.push_back(run(e, p));
  }
  // A budget for about two sequences at a time forces preemption; everything still finishes.
  EngineOptions tight;
  const StateCosts costs = state_costs(be.config());
  tight.kv_memory_bytes = costs.bytes_at(need) * 5 / 2;
  tight.max_model_len = need;
  Engine e(be, tight);
  // Every request queued before the engine starts: its first schedule sees them all, so the
  // budget forces preemption however the test's thread and the engine's are scheduled (with the
  // engine running first, a loaded CI machine could finish early requests before later ones came).
  std::vector<std::unique_ptr<Generation>> gens;
  for (const auto& p : plans) gens.push_back(std::make_unique<Generation>(e, tok(), p, TokenMap{static_cast<int64_t>(tok().vocab_size())}, nullptr));
  e.start();
  for (size_t i = 0; i < gens.size(); ++i) {
    ResponseBuilder b(true, "tiny");
    std::vector<OutputDelta> d;
    while (!gens[i]->poll(std::chrono::milliseconds(1000), d)) {
      b.add(d);
      d.clear();
    }
    b.add(d);
    ojson r = b.final_response(gens[i]->summary());
    for (auto& c : r["choices"][0]["message"]["tool_calls"]) c.erase("id");
    r.erase("id");
    r.erase("created");
    EXPECT_EQ(r["choices"], solo[i]["choices"]) << i;
  }
  EXPECT_GT(e.stats().preemptions, 0);
}

}  // namespace
}  // namespace dsv4
