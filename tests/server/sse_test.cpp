// SSE framing and the OpenAI chunk/response shapes built from generation deltas.
#include <gtest/gtest.h>

#include <regex>

#include "server/response_builder.h"
#include "server/sse.h"

namespace dsv4 {
namespace {

// Splits an SSE stream into its `data:` payloads, checking the framing on the way.
std::vector<std::string> events(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = s.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << s.substr(pos);
    if (end == std::string::npos) break;
    const std::string ev = s.substr(pos, end - pos);
    EXPECT_EQ(ev.find('\n'), std::string::npos) << "an event spans lines: " << ev;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

TEST(server_sse, OneLinePerEventAndDone) {
  const std::string e = sse_event({{"content", "line1\nline2\r\n\"q\""}});
  EXPECT_EQ(e, "data: {\"content\":\"line1\\nline2\\r\\n\\\"q\\\"\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_keepalive().front(), ':');  // a comment: clients skip it
  // Invalid UTF-8 never makes framing throw.
  EXPECT_NO_THROW(sse_event({{"t", std::string("\xff\xfe")}}));
}

TEST(server_sse, ChatStreamShape) {
  ResponseBuilder b(true, "tiny");
  std::string s = b.stream_open();
  using K = OutputDelta::Kind;
  s += b.stream_deltas({{K::kReasoning, -1, "think "}, {K::kReasoning, -1, "more"}, {K::kContent, -1, "Hi"},
                        {K::kToolBegin, 0, "get_weather"}, {K::kToolArgs, 0, "{\"city\": "}, {K::kToolArgs, 0, "\"Paris\"}"},
                        {K::kToolBegin, 1, "now"}, {K::kToolArgs, 1, "{}"}});
  GenerationSummary sum;
  sum.finish_reason = "tool_calls";
  sum.prompt_tokens = 10;
  sum.cached_tokens = 4;
  sum.completion_tokens = 7;
  sum.reasoning_tokens = 3;
  s += b.stream_close(sum, true);
  const auto ev = events(s);
  ASSERT_EQ(ev.size(), 10u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::vector<ojson> j;
  for (size_t i = 0; i + 1 < ev.size(); ++i) j.push_back(ojson::parse(ev[i]));
  for (const auto& c : j) {
    EXPECT_EQ(c["id"], b.id());
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["model"], "tiny");
  }
  EXPECT_EQ(j[0]["choices"][0]["delta"], ojson({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(j[1]["choices"][0]["delta"]["reasoning_content"], "think more");  // merged
  EXPECT_EQ(j[2]["choices"][0]["delta"]["content"], "Hi");
  const ojson& head = j[3]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(head["index"], 0);
  EXPECT_TRUE(std::regex_match(head["id"].get<std::string>(), std::regex("call_[0-9a-f]{24}")));
  EXPECT_EQ(head["function"]["name"], "get_weather");
  EXPECT_EQ(head["function"]["arguments"], "");
  EXPECT_EQ(j[4]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  EXPECT_EQ(j[5]["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
  EXPECT_NE(j[5]["choices"][0]["delta"]["tool_calls"][0]["id"], head["id"]);
  EXPECT_EQ(j[6]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(j[7]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(j[7]["choices"][0]["delta"], ojson::object());
  EXPECT_TRUE(j[8]["choices"].empty());
  const ojson& u = j[8]["usage"];
  EXPECT_EQ(u["total_tokens"], 17);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(u["completion_tokens_details"]["reasoning_tokens"], 3);
  EXPECT_EQ(u["prompt_cache_miss_tokens"], 6);
}

TEST(server_sse, UsageChunkOnlyWhenAskedAndErrorsEndTheStream) {
  ResponseBuilder b(false, "tiny");
  GenerationSummary sum;
  sum.finish_reason = "length";
  auto ev = events(b.stream_deltas({{OutputDelta::Kind::kContent, -1, "abc"}}) + b.stream_close(sum, false));
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ojson::parse(ev[0])["choices"][0]["text"], "abc");
  EXPECT_EQ(ojson::parse(ev[0])["object"], "text_completion");
  EXPECT_EQ(ojson::parse(ev[1])["choices"][0]["finish_reason"], "length");
  sum.finish_reason = "error";
  sum.error = "boom";
  ev = events(b.stream_close(sum, true));
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ojson::parse(ev[0])["error"]["message"], "boom");
  EXPECT_EQ(ev[1], "[DONE]");
}

TEST(server_sse, NonStreamingMessage) {
  ResponseBuilder b(true, "tiny");
  using K = OutputDelta::Kind;
  b.add({{K::kToolBegin, 0, "f"}, {K::kToolArgs, 0, "{\"a\": "}, {K::kToolArgs, 0, "1}"}});
  GenerationSummary sum;
  sum.finish_reason = "tool_calls";
  const ojson r = b.final_response(sum);
  EXPECT_EQ(r["object"], "chat.completion");
  const ojson& m = r["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());  // only tool calls: null, as OpenAI
  EXPECT_TRUE(m["reasoning_content"].is_null());
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace dsv4
