// Output grammar (serving.md §3): the strict reference parser on every §3/§10.2 example,
// and the streaming state machine (§3.3) fed whole, byte by byte and in random chunks,
// which must agree with the strict parser and never leak markup into text deltas.
#include <random>

#include <gtest/gtest.h>

#include "chat/json_dumps.h"
#include "chat/output_parser.h"
#include "chat/stream_parser.h"
#include "core/error.h"

namespace dsv4 {
namespace {

const std::string EOS = "<｜end▁of▁sentence｜>";
constexpr auto TH = ThinkingMode::kThinking;
constexpr auto CH = ThinkingMode::kChat;
StreamParserOptions chat_opts() {
  StreamParserOptions o;
  o.mode = CH;
  return o;
}

// §10.2, verbatim.
const std::string kParallel =
    "The user wants Paris weather in celsius for two days, and London for comparison. I will call get_weather "
    "twice.</think>Let me look that up.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
    "name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"unit\" "
    "string=\"true\">celsius</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" "
    "string=\"false\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter "
    "name=\"city\" string=\"true\">London</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
const char* kParallelJson = R"({
  "role": "assistant",
  "content": "Let me look that up.",
  "reasoning_content": "The user wants Paris weather in celsius for two days, and London for comparison. I will call get_weather twice.",
  "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\", \"days\": 2}"}},
    {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"London\"}"}}
  ]
})";
const std::string kChatTool =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
const std::string kQuotes =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"text\" string=\"true\">He said "
    "\"hi\"\nline2</｜DSML｜parameter>\n<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, 2], \"b\": "
    "true}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS;
const std::string kNoParams =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS;

TEST(chat_strict_parser, ParallelToolCallsExactJson) {
  EXPECT_EQ(to_openai_json(parse_completion_strict(kParallel, TH)), ojson::parse(kParallelJson));
}

TEST(chat_strict_parser, ChatModeEmptyContentBeforeBlock) {
  const auto m = parse_completion_strict(kChatTool, CH);
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.reasoning_content, "");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "Paris"})");
}

TEST(chat_strict_parser, StringAndObjectValues) {
  const auto m = parse_completion_strict(kQuotes, CH);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"text": "He said \"hi\"\nline2", "opts": {"a": [1, 2], "b": true}})");
  EXPECT_NO_THROW(ojson::parse(m.tool_calls[0].arguments));
}

TEST(chat_strict_parser, NoParametersGivesEmptyObject) {
  EXPECT_EQ(parse_completion_strict(kNoParams, CH).tool_calls.at(0).arguments, "{}");
  // One "\n" instead of the empty line is accepted too.
  const std::string one = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS;
  EXPECT_EQ(parse_completion_strict(one, CH).tool_calls.at(0).arguments, "{}");
}

TEST(chat_strict_parser, PlainAnswers) {
  auto m = parse_completion_strict("r1\nr2</think>\nHello!\n" + EOS, TH);
  EXPECT_EQ(m.reasoning_content, "r1\nr2");
  EXPECT_EQ(m.content, "\nHello!\n");  // the reference keeps newlines
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(parse_completion_strict("Hi" + EOS, CH).content, "Hi");
  // EOS may be missing only after a tool block.
  EXPECT_NO_THROW(parse_completion_strict(kNoParams.substr(0, kNoParams.size() - EOS.size()), CH));
}

TEST(chat_strict_parser, RejectsMalformed) {
  const std::string bad[] = {
      "no think end" + EOS,                                  // thinking: missing </think>
      "r</think>answer",                                     // missing EOS
      "r</think>a" + EOS + "more",                           // text after EOS
      "r</think>a<think>b" + EOS,                            // special token in content
      "r</think>a｜DSML｜b" + EOS,
      "r</think>" + kChatTool.substr(0, kChatTool.size() - EOS.size()) + "junk" + EOS,  // junk after block
      "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"a\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS,  // dup
      "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"maybe\">1</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS,  // bad string flag
      "r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">1</｜DSML｜parameter>\n",
      "reasoning\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>" + EOS,  // block inside reasoning
  };
  for (const auto& t : bad) EXPECT_THROW(parse_completion_strict(t, TH), Error) << t;
}

// ---- streaming ------------------------------------------------------------------------------

std::vector<std::string> chunk(const std::string& s, std::mt19937& rng, int max_len) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t n = 1 + rng() % max_len;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

struct Streamed {
  ParsedMessage msg;
  std::vector<StreamEvent> events;
  int anomalies = 0;
};

Streamed stream(const std::vector<std::string>& chunks, StreamParserOptions opt) {
  StreamParser p(opt);
  Streamed r;
  for (const auto& c : chunks) p.feed(c, r.events);
  p.finish(r.events);
  r.msg = p.result();
  r.anomalies = p.anomalies();
  return r;
}

// The message rebuilt from events alone, as an SSE client would.
ParsedMessage from_events(const std::vector<StreamEvent>& ev) {
  ParsedMessage m;
  for (const auto& e : ev) {
    switch (e.kind) {
      case StreamEvent::Kind::kReasoning: m.reasoning_content += e.text; break;
      case StreamEvent::Kind::kContent: m.content += e.text; break;
      case StreamEvent::Kind::kToolCallBegin:
        EXPECT_EQ(e.index, static_cast<int>(m.tool_calls.size()));
        m.tool_calls.push_back({e.text, ""});
        break;
      case StreamEvent::Kind::kToolCallArgs: m.tool_calls.at(e.index).arguments += e.text; break;
      case StreamEvent::Kind::kToolCallEnd: break;
    }
  }
  return m;
}

void expect_clean_deltas(const std::vector<StreamEvent>& ev) {
  for (const auto& e : ev) {
    if (e.kind != StreamEvent::Kind::kReasoning && e.kind != StreamEvent::Kind::kContent) continue;
    for (const char* bad : {"｜DSML｜", "</think>", "<think>", "<｜end▁of▁sentence｜>", "\xEF\xBD\x9C"})
      EXPECT_EQ(e.text.find(bad), std::string::npos) << e.text;
  }
}

struct Sample {
  std::string text;
  ThinkingMode mode;
};
std::vector<Sample> valid_samples() {
  return {
      {kParallel, TH},
      {kChatTool, CH},
      {kQuotes, CH},
      {kNoParams, CH},
      {"just thinking</think>and an answer with é漢😀 and <b>html</b> and a < sign" + EOS, TH},
      {"</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"x\">\n<｜DSML｜parameter name=\"a b\" string=\"true\">v</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"string=\" string=\"false\">[1]</｜DSML｜parameter>\n<｜DSML｜parameter name=\"名前\" string=\"true\">値\\</｜DSML｜parameter>\n"
       "<｜DSML｜parameter name=\"\" string=\"true\"></｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS, TH},
      {"Multi\nline\n\ncontent\n" + EOS, CH},
      {"r</think>text\n\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"t\" string=\"true\">tab\tctl\x01 </b> <｜x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS, TH},
  };
}

TEST(chat_stream_parser, RawModeEqualsStrictForEveryChunking) {
  std::mt19937 rng(123);
  StreamParserOptions raw;
  raw.strip_newlines = false;
  for (const auto& s : valid_samples()) {
    raw.mode = s.mode;
    const ParsedMessage want = parse_completion_strict(s.text, s.mode);
    std::vector<std::vector<std::string>> chunkings;
    chunkings.push_back({s.text});
    std::vector<std::string> bytes;
    for (char c : s.text) bytes.push_back(std::string(1, c));
    chunkings.push_back(bytes);
    for (int k = 0; k < 200; ++k) chunkings.push_back(chunk(s.text, rng, 1 + k % 24));
    for (const auto& ch : chunkings) {
      const Streamed r = stream(ch, raw);
      EXPECT_EQ(r.msg, want) << s.text;
      EXPECT_EQ(from_events(r.events), want);
      EXPECT_EQ(r.anomalies, 0);
      expect_clean_deltas(r.events);
    }
  }
}

TEST(chat_stream_parser, EverySplitPointOfTheParallelExample) {  // DeepSeek's own split-point test
  const ParsedMessage want = parse_completion_strict(kParallel, TH);
  for (std::size_t cut = 0; cut <= kParallel.size(); ++cut) {
    const Streamed r = stream({kParallel.substr(0, cut), kParallel.substr(cut)}, {});
    EXPECT_EQ(r.msg, want) << cut;
    expect_clean_deltas(r.events);
  }
}

TEST(chat_stream_parser, DefaultModeStripsNewlinesLikeTheRecipe) {
  std::mt19937 rng(5);
  const std::string t = "\n\nreasoning\n\n</think>\n\nanswer\n\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS;
  for (int k = 0; k < 100; ++k) {
    const Streamed r = stream(chunk(t, rng, 1 + k % 7), {});
    EXPECT_EQ(r.msg.reasoning_content, "reasoning");
    EXPECT_EQ(r.msg.content, "answer");
    ASSERT_EQ(r.msg.tool_calls.size(), 1u);
    EXPECT_EQ(r.msg.tool_calls[0].arguments, "{}");
  }
  // Interior newlines are content.
  EXPECT_EQ(StreamParser::parse("\n\na\n\nb\n" + EOS, chat_opts()).content, "a\n\nb\n");
}

TEST(chat_stream_parser, EventsOfTheParallelExample) {
  std::vector<StreamEvent> ev;
  StreamParser p;
  p.feed(kParallel, ev);
  p.finish(ev);
  using K = StreamEvent::Kind;
  std::vector<K> kinds;
  for (const auto& e : ev) kinds.push_back(e.kind);
  EXPECT_EQ(kinds, (std::vector<K>{K::kReasoning, K::kContent, K::kToolCallBegin, K::kToolCallArgs, K::kToolCallEnd,
                                   K::kToolCallBegin, K::kToolCallArgs, K::kToolCallEnd}));
  EXPECT_EQ(ev[2].text, "get_weather");
  EXPECT_EQ(ev[5].index, 1);
  EXPECT_EQ(ev[3].text, R"({"city": "Paris", "unit": "celsius", "days": 2})");
  EXPECT_TRUE(p.finished());
  EXPECT_EQ(p.anomalies(), 0);
}

TEST(chat_stream_parser, ArgumentsStreamIncrementally) {
  StreamParser p;
  std::vector<StreamEvent> ev;
  const std::size_t cut = kParallel.find("\">Paris") + 5;  // mid-value
  p.feed(kParallel.substr(0, cut), ev);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().kind, StreamEvent::Kind::kToolCallArgs);
  EXPECT_EQ(ev.back().text, "{\"city\": \"Par");
}

TEST(chat_stream_parser, MarkerSplitAcrossChunksNeverLeaks) {
  StreamParser p(chat_opts());
  std::vector<StreamEvent> ev;
  p.feed("hello <｜DS", ev);
  for (const auto& e : ev) EXPECT_EQ(e.text.find("<"), std::string::npos);
  p.feed("ML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", ev);
  p.finish(ev);
  EXPECT_EQ(p.result().content, "hello ");  // trailing space kept, "<｜DSML｜" consumed
  EXPECT_EQ(p.result().tool_calls.size(), 1u);
  // A '<' that turns out not to be a marker is released.
  StreamParser q(chat_opts());
  std::vector<StreamEvent> ev2;
  q.feed("a <", ev2);
  q.feed("b>", ev2);
  q.finish(ev2);
  EXPECT_EQ(q.result().content, "a <b>");
}

TEST(chat_stream_parser, NeverSplitsUtf8Characters) {
  const std::string t = "思考😀</think>答案é" + EOS;
  StreamParser p;
  std::vector<StreamEvent> ev;
  for (char c : t) p.feed(std::string(1, c), ev);
  p.finish(ev);
  for (const auto& e : ev) {
    for (std::size_t i = 0; i < e.text.size(); ++i) (void)i;
    EXPECT_TRUE(e.text.empty() || (static_cast<unsigned char>(e.text[0]) & 0xC0) != 0x80) << e.text;
  }
  EXPECT_EQ(p.result().reasoning_content, "思考😀");
  EXPECT_EQ(p.result().content, "答案é");
}

TEST(chat_stream_parser, ToleratesDeviations) {
  // Tool block inside the reasoning (no </think>).
  auto m = StreamParser::parse("thinking\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS, {});
  EXPECT_EQ(m.reasoning_content, "thinking");
  EXPECT_EQ(m.tool_calls.size(), 1u);
  // Missing </think>: all reasoning.
  m = StreamParser::parse("only thoughts" + EOS, {});
  EXPECT_EQ(m.reasoning_content, "only thoughts");
  EXPECT_EQ(m.content, "");
  // Stray </think> in chat mode, bare DSML token, <think>: dropped.
  StreamParser p(chat_opts());
  std::vector<StreamEvent> ev;
  p.feed("a</think>b｜DSML｜c<think>d" + EOS, ev);
  p.finish(ev);
  EXPECT_EQ(p.result().content, "abcd");
  EXPECT_EQ(p.anomalies(), 3);
  // JSON-object invoke body (SGLang tolerance).
  m = StreamParser::parse("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">{\"city\": \"Paris\"}</｜DSML｜invoke>\n</｜DSML｜tool_calls>" + EOS, chat_opts());
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "Paris"})");
  // Text after the block is discarded and counted.
  StreamParser q(chat_opts());
  q.feed(kChatTool.substr(0, kChatTool.size() - EOS.size()) + "junk", ev);
  q.finish(ev);
  EXPECT_EQ(q.result().content, "");
  EXPECT_GT(q.anomalies(), 0);
}

TEST(chat_stream_parser, TruncatedOutputStillGivesValidJson) {
  const std::string full = kParallel;
  const std::size_t start = full.find("<｜DSML｜invoke");
  for (std::size_t cut = start; cut < full.size(); cut += 3) {
    const auto m = StreamParser::parse(full.substr(0, cut), {});
    for (const auto& c : m.tool_calls) EXPECT_NO_THROW(ojson::parse(c.arguments)) << cut << ": " << c.arguments;
  }
}

TEST(chat_stream_parser, StopStringsOnlyInContent) {
  StreamParserOptions o;
  o.stop = {"STOP", "\n\nEND"};
  std::mt19937 rng(9);
  const std::string t = "reason STOP here</think>visible\n\nENDhidden" + EOS;
  for (int k = 0; k < 50; ++k) {
    StreamParser p(o);
    std::vector<StreamEvent> ev;
    for (const auto& c : chunk(t, rng, 1 + k % 5)) p.feed(c, ev);
    p.finish(ev);
    EXPECT_EQ(p.result().reasoning_content, "reason STOP here");
    EXPECT_EQ(p.result().content, "visible");
    EXPECT_TRUE(p.stopped_by_stop_string());
  }
}

}  // namespace
}  // namespace dsv4
