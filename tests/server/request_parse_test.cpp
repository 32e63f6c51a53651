// Request validation: every client mistake is a 4xx ApiError naming the field, and valid
// requests map onto the engine/encoder settings serving.md §4 prescribes.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/request_parse.h"

namespace dsv4 {
namespace {

const Tokenizer& tok() {
  static Tokenizer t = Tokenizer::from_file(std::string(DSV4_SOURCE_DIR) + "/models/tiny/tokenizer.json");
  return t;
}

ApiConfig cfg() {
  ApiConfig c;
  c.served_model_name = "tiny";
  c.max_model_len = 64;
  return c;
}

ojson chat(ojson extra = ojson::object()) {
  ojson b = {{"model", "tiny"}, {"messages", ojson::array({{{"role", "user"}, {"content", "Hi"}}})}};
  for (auto it = extra.begin(); it != extra.end(); ++it) b[it.key()] = it.value();
  return b;
}

std::string prompt_text(const GenerationPlan& p) {
  std::vector<TokenId> ids(p.prompt.begin(), p.prompt.end());
  return tok().decode(ids);
}

// The ApiError a chat body raises (status 0 when it is accepted).
ApiError chat_error(const ojson& body, const ApiConfig& c = cfg()) {
  try {
    parse_chat_request(body, c, tok());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "accepted");
}

ApiError completion_error(const ojson& body) {
  try {
    parse_completion_request(body, cfg(), tok());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "accepted");
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

TEST(server_request, RejectsWrongTypesAndRangesNamingTheField) {
  struct Case {
    ojson extra;
    std::string param;
  } cases[] = {
      {{{"temperature", "hot"}}, "temperature"},
      {{{"temperature", 3}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1.5}}, "top_p"},
      {{{"top_k", 2.5}}, "top_k"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", "ten"}}, "max_tokens"},
      {{{"max_completion_tokens", -3}}, "max_completion_tokens"},
      {{{"presence_penalty", 5}}, "presence_penalty"},
      {{{"frequency_penalty", -2.5}}, "frequency_penalty"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"seed", "x"}}, "seed"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stop", 5}}, "stop"},
      {{{"stop", ojson::array({""})}}, "stop"},
      {{{"logit_bias", {{"abc", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", 1000}}}}, "logit_bias"},
      {{{"n", 2}}, "n"},
      {{{"logprobs", 1}}, "logprobs"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"logprobs", true}, {"top_logprobs", -1}}, "top_logprobs"},
      {{{"top_logprobs", 3}}, "top_logprobs"},
      {{{"logprobs", false}, {"top_logprobs", 2}}, "top_logprobs"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"reasoning_effort", "extreme"}}, "reasoning_effort"},
      {{{"thinking", {{"type", "sometimes"}}}}, "thinking"},
      {{{"chat_template_kwargs", {{"thinking", "yes"}}}}, "chat_template_kwargs.thinking"},
      {{{"tools", ojson::array({{{"type", "retrieval"}}})}}, "tools"},
      {{{"tools", ojson::array({{{"type", 5}}})}}, "tools"},
      {{{"tool_choice", {{"type", 5}}}}, "tool_choice"},
      {{{"tool_choice", "always"}}, "tool_choice"},
      {{{"response_format", {{"type", "xml"}}}}, "response_format"},
  };
  for (const auto& c : cases) {
    const ApiError e = chat_error(chat(c.extra));
    EXPECT_EQ(e.status, 400) << c.extra.dump();
    EXPECT_EQ(e.param, c.param) << c.extra.dump() << " -> " << e.what();
    EXPECT_EQ(e.type, "invalid_request_error");
  }
}

TEST(server_request, ChatLogprobsReachTheSampler) {
  GenerationPlan p = parse_chat_request(chat({{"logprobs", true}, {"top_logprobs", 5}}), cfg(), tok());
  EXPECT_TRUE(p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 5);
  GenerationPlan q = parse_chat_request(chat({{"logprobs", false}, {"top_logprobs", 0}}), cfg(), tok());
  EXPECT_FALSE(q.sampling.logprobs);
  EXPECT_EQ(q.sampling.top_logprobs, 0);
  // Thinking mode's fixed sampling keeps what the client asked to see.
  GenerationPlan t = parse_chat_request(
      chat({{"logprobs", true}, {"top_logprobs", 2}, {"thinking", {{"type", "enabled"}}}}), cfg(), tok());
  EXPECT_TRUE(t.sampling.logprobs);
  EXPECT_EQ(t.sampling.top_logprobs, 2);
}

TEST(server_request, ModelAndMessagesAreChecked) {
  ojson b = chat();
  b["model"] = "gpt-4";
  ApiError e = chat_error(b);
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  b.erase("model");
  EXPECT_EQ(chat_error(b).status, 400);
  EXPECT_EQ(chat_error(ojson::array()).status, 400);  // not an object
  EXPECT_EQ(chat_error(chat({{"messages", ojson::array()}})).param, "messages");
  EXPECT_EQ(chat_error(chat({{"messages", "hi"}})).param, "messages");
  EXPECT_EQ(chat_error(chat({{"messages", ojson::array({{{"content", "no role"}}})}})).param, "messages");
  EXPECT_EQ(chat_error(chat({{"messages", ojson::array({{{"role", "wizard"}, {"content", "x"}}})}})).param, "messages");
  // No generation prompt would follow an assistant/system message.
  ojson last_asst = chat({{"messages", ojson::array({{{"role", "user"}, {"content", "q"}},
                                                     {{"role", "assistant"}, {"content", "a"}}})}});
  EXPECT_EQ(chat_error(last_asst).status, 400);
  last_asst["messages"][1]["prefix"] = true;  // DeepSeek prefix completion: accepted
  EXPECT_EQ(chat_error(last_asst).status, 0);
  // Content of a wrong type is an encoder error, reported as 400 on messages.
  EXPECT_EQ(chat_error(chat({{"messages", ojson::array({{{"role", "user"}, {"content", 5}}})}})).param, "messages");
}

TEST(server_request, PromptLongerThanTheContextIs400) {
  std::string longtext;
  for (int i = 0; i < 200; ++i) longtext += "word ";
  ApiError e = chat_error(chat({{"messages", ojson::array({{{"role", "user"}, {"content", longtext}}})}}));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_NE(std::string(e.what()).find("maximum context length is 64"), std::string::npos) << e.what();
  e = chat_error(chat({{"max_tokens", 60}}));  // fits alone, not with the prompt
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.code, "context_length_exceeded");
}

TEST(server_request, ThinkingSwitchesFollowTheSpecOrder) {
  auto mode = [](const ojson& extra) { return parse_chat_request(chat(extra), cfg(), tok()).mode; };
  EXPECT_EQ(mode({}), ThinkingMode::kThinking);  // server default: on
  EXPECT_EQ(mode({{"thinking", {{"type", "disabled"}}}}), ThinkingMode::kChat);
  EXPECT_EQ(mode({{"chat_template_kwargs", {{"thinking", false}}}}), ThinkingMode::kChat);
  EXPECT_EQ(mode({{"chat_template_kwargs", {{"enable_thinking", false}}}}), ThinkingMode::kChat);
  EXPECT_EQ(mode({{"reasoning_effort", "none"}}), ThinkingMode::kChat);
  // The DeepSeek-native switch wins over the others.
  EXPECT_EQ(mode({{"thinking", {{"type", "enabled"}}}, {"chat_template_kwargs", {{"thinking", false}}}}),
            ThinkingMode::kThinking);
  ApiConfig off = cfg();
  off.default_thinking = false;
  EXPECT_EQ(parse_chat_request(chat(), off, tok()).mode, ThinkingMode::kChat);

  const GenerationPlan t = parse_chat_request(chat(), cfg(), tok());
  EXPECT_TRUE(ends_with(prompt_text(t), "<｜Assistant｜><think>")) << prompt_text(t);
  const GenerationPlan c = parse_chat_request(chat({{"thinking", {{"type", "disabled"}}}}), cfg(), tok());
  EXPECT_TRUE(ends_with(prompt_text(c), "<｜Assistant｜></think>")) << prompt_text(c);
  // "max" effort adds the preview prefix right after BOS.
  ApiConfig big = cfg();
  big.max_model_len = 1024;
  const GenerationPlan m = parse_chat_request(chat({{"reasoning_effort", "max"}}), big, tok());
  EXPECT_NE(prompt_text(m).find("Reasoning Effort: Absolute maximum"), std::string::npos);
}

TEST(server_request, ThinkingModeFixesSamplingUnlessOptedOut) {
  const GenerationPlan t = parse_chat_request(chat({{"temperature", 0}, {"top_p", 0.5}}), cfg(), tok());
  EXPECT_EQ(t.sampling.temperature, 1.0f);
  EXPECT_EQ(t.sampling.top_p, 1.0f);
  const GenerationPlan k =
      parse_chat_request(chat({{"temperature", 0}, {"deepseek_v4_sampling_override", false}}), cfg(), tok());
  EXPECT_EQ(k.sampling.temperature, 0.0f);
  const GenerationPlan c = parse_chat_request(chat({{"temperature", 0.5}, {"thinking", {{"type", "disabled"}}}}), cfg(), tok());
  EXPECT_EQ(c.sampling.temperature, 0.5f);
}

TEST(server_request, ToolChoice) {
  ojson tools = ojson::array({{{"type", "function"},
                               {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  ApiConfig big = cfg();
  big.max_model_len = 1024;
  const ojson off = {{"type", "disabled"}};
  GenerationPlan a = parse_chat_request(chat({{"tools", tools}}), big, tok());
  EXPECT_TRUE(a.parse_tools);
  EXPECT_NE(prompt_text(a).find("## Tools"), std::string::npos);
  GenerationPlan n = parse_chat_request(chat({{"tools", tools}, {"tool_choice", "none"}}), big, tok());
  EXPECT_FALSE(n.parse_tools);
  EXPECT_NE(prompt_text(n).find("## Tools"), std::string::npos);  // still rendered (cacheable prefix)

  ojson named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  GenerationPlan f = parse_chat_request(chat({{"tools", tools}, {"tool_choice", named}, {"thinking", off}}), big, tok());
  EXPECT_TRUE(ends_with(prompt_text(f), "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"))
      << prompt_text(f);
  GenerationPlan r = parse_chat_request(chat({{"tools", tools}, {"tool_choice", "required"}, {"thinking", off}}), big, tok());
  EXPECT_TRUE(ends_with(prompt_text(r), "</think>\n\n<｜DSML｜tool_calls>\n"));

  EXPECT_EQ(chat_error(chat({{"tools", tools}, {"tool_choice", "required"}}), big).param, "tool_choice");  // thinking
  ojson other = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  EXPECT_EQ(chat_error(chat({{"tools", tools}, {"tool_choice", other}, {"thinking", off}}), big).param, "tool_choice");
  EXPECT_EQ(chat_error(chat({{"tool_choice", "required"}}), big).param, "tool_choice");  // no tools
}

TEST(server_request, Completions) {
  GenerationPlan p = parse_completion_request({{"model", "tiny"}, {"prompt", ojson::array({5, 6, 7})}}, cfg(), tok());
  EXPECT_EQ(p.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(p.stop.max_tokens, 16);  // OpenAI default
  EXPECT_FALSE(p.chat);
  GenerationPlan s = parse_completion_request({{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 4}}, cfg(), tok());
  EXPECT_EQ(s.prompt[0], 0);  // BOS prepended
  EXPECT_EQ(s.stop.max_tokens, 4);
  GenerationPlan one = parse_completion_request({{"model", "tiny"}, {"prompt", ojson::array({"Hello"})}}, cfg(), tok());
  EXPECT_EQ(one.prompt, s.prompt);

  EXPECT_EQ(completion_error({{"model", "tiny"}}).param, "prompt");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", ojson::array({1, -4})}}).param, "prompt");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", ojson::array({1, 99999999})}}).param, "prompt");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", ojson::array({"a", "b"})}}).param, "prompt");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", 5}}).param, "prompt");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"best_of", 3}}).param, "best_of");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"echo", true}}).param, "echo");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"suffix", "y"}}).param, "suffix");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"logprobs", 21}}).param, "logprobs");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"logprobs", true}}).param, "logprobs");
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"top_logprobs", 2}}).param, "top_logprobs");
  GenerationPlan lp = parse_completion_request({{"model", "tiny"}, {"prompt", "x"}, {"logprobs", 3}}, cfg(), tok());
  EXPECT_TRUE(lp.sampling.logprobs);
  EXPECT_EQ(lp.sampling.top_logprobs, 3);
  EXPECT_EQ(completion_error({{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 100}}).code, "context_length_exceeded");
  EXPECT_EQ(completion_error({{"model", "other"}, {"prompt", "x"}}).status, 404);
}

TEST(server_request, ErrorBodyHasOpenAIShape) {
  const ojson b = error_body(ApiError(400, "bad", "temperature"));
  ASSERT_TRUE(b.contains("error"));
  EXPECT_EQ(b["error"]["message"], "bad");
  EXPECT_EQ(b["error"]["type"], "invalid_request_error");
  EXPECT_EQ(b["error"]["param"], "temperature");
  EXPECT_TRUE(b["error"]["code"].is_null());
  EXPECT_EQ(error_body(ApiError(401, "key"))["error"]["type"], "authentication_error");
}

}  // namespace
}  // namespace dsv4
