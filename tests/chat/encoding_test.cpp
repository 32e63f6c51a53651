// Prompt rendering: the worked examples of serving.md §10.1 byte-for-byte, one test per
// rule of §2.3-§2.13, and Python-json.dumps parity of the JSON printer (§2.11).
#include <fstream>

#include <gtest/gtest.h>

#include "chat/encoding.h"
#include "chat/json_dumps.h"
#include "core/error.h"

namespace dsv4 {
namespace {

const std::string BOS = "<｜begin▁of▁sentence｜>", EOS = "<｜end▁of▁sentence｜>", U = "<｜User｜>", A = "<｜Assistant｜>";

ojson J(const char* s) { return ojson::parse(s); }

std::string enc(const char* msgs, bool thinking, bool drop = true, bool dev_as_system = true) {
  EncodeOptions o;
  o.thinking_mode = thinking ? ThinkingMode::kThinking : ThinkingMode::kChat;
  o.drop_thinking = drop;
  o.developer_as_system = dev_as_system;
  return encode_messages(J(msgs), o);
}

std::size_t codepoints(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

TEST(chat_encoding_goldens, WorkedExamplesOfSection10) {
  std::ifstream f(std::string(DSV4_SOURCE_DIR) + "/tests/chat/data/encoding_goldens.json");
  ASSERT_TRUE(f);
  const ojson g = ojson::parse(f);
  ASSERT_EQ(g["cases"].size(), 10u);
  for (const auto& c : g["cases"]) {
    ojson msgs = c["messages"];
    if (c.contains("tools")) attach_tools(msgs, c["tools"]);
    EncodeOptions o;
    const auto& op = c["options"];
    o.thinking_mode = op.value("thinking", true) ? ThinkingMode::kThinking : ThinkingMode::kChat;
    o.drop_thinking = op.value("drop_thinking", true);
    o.profile = op.value("profile", "preview") == "0731" ? EffortProfile::k0731 : EffortProfile::kPreview;
    o.reasoning_effort = op.value("effort", "");
    EXPECT_EQ(encode_messages(msgs, o), c["expected"].get<std::string>()) << c["name"];
  }
}

TEST(chat_encoding_goldens, ThinkingPromptIsPrefixOfContinuation) {  // §2.7 prefix-cache property
  std::ifstream f(std::string(DSV4_SOURCE_DIR) + "/tests/chat/data/encoding_goldens.json");
  const ojson g = ojson::parse(f);
  const std::string a = g["cases"][0]["expected"], c = g["cases"][2]["expected"];
  EXPECT_EQ(c.substr(0, a.size()), a);
}

// ---- §2.3 merge --------------------------------------------------------------------------

TEST(chat_encoding, ConsecutiveUsersMerge) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"a"},{"role":"user","content":"b"}])", false),
            BOS + U + "a\n\nb" + A + "</think>");
}

TEST(chat_encoding, ToolMessagesFoldIntoOneUserTurn) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[
      {"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"x","content":"R"},{"role":"user","content":"next"}])", false),
            BOS + U + "q" + A + "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
                EOS + U + "<tool_result>R</tool_result>\n\nnext" + A + "</think>");
}

TEST(chat_encoding, UserWithTaskIsNotMergedInto) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"a","task":"query"},{"role":"user","content":"b"}])", false),
            BOS + U + "a" + U + "b" + A + "</think>");
}

TEST(chat_encoding, ToolContentPartsJoined) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"q"},{"role":"tool","tool_call_id":"",
      "content":[{"type":"text","text":"p1"},{"type":"text","text":"p2"},{"type":"image_url"}]}])", false),
            BOS + U + "q\n\n<tool_result>p1\n\np2\n\n[Unsupported image_url]</tool_result>" + A + "</think>");
}

// ---- §2.4 order --------------------------------------------------------------------------

TEST(chat_encoding, ToolResultsSortedByCallOrder) {
  const std::string calls =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"fa\">\n\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"fb\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_EQ(enc(R"([{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[
      {"id":"a","type":"function","function":{"name":"fa","arguments":"{}"}},
      {"type":"function","function":{"id":"b","name":"fb","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"b","content":"RB"},{"role":"tool","tool_call_id":"a","content":"RA"},
      {"role":"user","content":"more"}])", false),
            BOS + U + "q" + A + "</think>" + calls + EOS + U +
                "<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>\n\nmore" + A + "</think>");
}

TEST(chat_encoding, UnknownToolIdsSortFirstAndTextKeepsItsSlot) {
  const std::string out = enc(R"([{"role":"user","content":"q"},{"role":"assistant","content":"","tool_calls":[
      {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
      {"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]},
      {"role":"tool","tool_call_id":"b","content":"RB"},{"role":"user","content":"mid"},
      {"role":"tool","tool_call_id":"zz","content":"RZ"}])", false);
  EXPECT_NE(out.find(U + "<tool_result>RZ</tool_result>\n\nmid\n\n<tool_result>RB</tool_result>" + A), std::string::npos) << out;
}

// ---- §2.5 drop policy --------------------------------------------------------------------

TEST(chat_encoding, DeveloperDroppedFromThinkingHistoryWithEncoderSemantics) {
  const char* m = R"([{"role":"developer","content":"D"},{"role":"user","content":"q1"},
      {"role":"assistant","reasoning_content":"r1","content":"a1"},{"role":"user","content":"q2"}])";
  EXPECT_EQ(enc(m, true, true, false), BOS + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "<think>");
  EXPECT_EQ(enc(m, false, true, false), BOS + U + "D" + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "</think>");
  // Recommended server behaviour (§4.6.1): developer == system, so it survives.
  EXPECT_EQ(enc(m, true), BOS + "D" + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "<think>");
}

TEST(chat_encoding, ToolsAnywhereKeepAllReasoning) {
  const char* m = R"([{"role":"system","content":"S","tools":[{"type":"function","function":{"name":"f"}}]},
      {"role":"user","content":"q1"},{"role":"assistant","reasoning_content":"r1","content":"a1"},
      {"role":"user","content":"q2"}])";
  const std::string out = enc(m, true);
  EXPECT_NE(out.find(U + "q1" + A + "<think>r1</think>a1" + EOS + U + "q2" + A + "<think>"), std::string::npos) << out;
}

TEST(chat_encoding, HistoryToolCallReasoningDroppedWithoutTools) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"q"},{"role":"assistant","reasoning_content":"r","content":"",
      "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},
      {"role":"tool","tool_call_id":"c","content":"R"}])", true),
            BOS + U + "q" + A +
                "</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>" +
                EOS + U + "<tool_result>R</tool_result>" + A + "<think>");
}

TEST(chat_encoding, LatestReminderKeptAndRendered) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},
      {"role":"latest_reminder","content":"date"},{"role":"user","content":"q2"}])", true),
            BOS + U + "q1" + A + "</think>a1" + EOS + "<｜latest_reminder｜>date" + U + "q2" + A + "<think>");
}

// ---- §2.6 render -------------------------------------------------------------------------

TEST(chat_encoding, LastAssistantAfterLastUserKeepsEmptyThinking) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"q"},{"role":"assistant","content":"ans"}])", true),
            BOS + U + "q" + A + "<think></think>ans" + EOS);
}

TEST(chat_encoding, PrefixContinuationWithoutEos) {
  const char* m = R"([{"role":"user","content":"q"},{"role":"assistant","content":"```python\n","wo_eos":true}])";
  EXPECT_EQ(enc(m, true), BOS + U + "q" + A + "<think></think>```python\n");
  EXPECT_EQ(enc(m, false), BOS + U + "q" + A + "</think>```python\n");
}

TEST(chat_encoding, MidConversationSystemIsRaw) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"a"},{"role":"assistant","content":"A"},{"role":"system","content":"SYS2"},
      {"role":"user","content":"b"}])", false),
            BOS + U + "a" + A + "</think>A" + EOS + "SYS2" + U + "b" + A + "</think>");
}

TEST(chat_encoding, SystemLastGetsNoGenerationPrompt) {
  EXPECT_EQ(enc(R"([{"role":"system","content":"S"}])", true), BOS + "S");
}

TEST(chat_encoding, EmptyAndNullUserContent) {
  EXPECT_EQ(enc(R"([{"role":"user","content":""}])", false), BOS + U + A + "</think>");
  EXPECT_EQ(enc(R"([{"role":"user","content":null}])", false), BOS + U + A + "</think>");
}

TEST(chat_encoding, TaskTokens) {
  EXPECT_EQ(enc(R"([{"role":"user","content":"x","task":"title"}])", true), BOS + U + "x<｜title｜>");
  EXPECT_EQ(enc(R"([{"role":"user","content":"x","task":"action"},{"role":"assistant","content":"r"}])", true),
            BOS + U + "x" + A + "<think><｜action｜>r" + EOS);
  EXPECT_EQ(enc(R"([{"role":"user","content":"x","task":"action"}])", false), BOS + U + "x" + A + "</think><｜action｜>");
  EXPECT_THROW(enc(R"([{"role":"user","content":"x","task":"nope"}])", true), Error);
}

TEST(chat_encoding, ContextSuppressesBosAndEffort) {
  EncodeOptions o;
  o.reasoning_effort = "max";
  const ojson ctx = J(R"([{"role":"user","content":"q1"},{"role":"assistant","content":"a1"}])");
  EXPECT_EQ(encode_messages(J(R"([{"role":"user","content":"q2"}])"), o, ctx), U + "q2" + A + "<think>");
}

TEST(chat_encoding, Errors) {
  // chat mode: in thinking mode an early developer message is dropped before it is checked
  EXPECT_THROW(enc(R"([{"role":"developer","content":""},{"role":"user","content":"q"}])", false, true, false), Error);
  EXPECT_THROW(enc(R"([{"role":"wizard","content":"x"}])", true), Error);
  EXPECT_THROW(enc(R"([{"content":"x"}])", true), Error);
  EXPECT_THROW(enc(R"({"role":"user"})", true), Error);
  EXPECT_THROW(enc(R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])", true), Error);
}

// ---- §2.12 / §4.6 input normalization ---------------------------------------------------

TEST(chat_encoding, ContentPartsFlattened) {
  const char* m = R"([{"role":"user","content":[{"type":"text","text":"p1"},{"type":"text","text":"p2"}]}])";
  EXPECT_EQ(enc(m, false), BOS + U + "p1\n\np2" + A + "</think>");
  EncodeOptions o;
  o.thinking_mode = ThinkingMode::kChat;
  o.content_part_separator = "\n";
  EXPECT_EQ(encode_messages(J(m), o), BOS + U + "p1\np2" + A + "</think>");
}

TEST(chat_encoding, ReasoningAliasAccepted) {
  const char* both = R"([{"role":"user","content":"q"},{"role":"assistant","reasoning_content":"rc","reasoning":"r","content":"a"}])";
  const char* alias = R"([{"role":"user","content":"q"},{"role":"assistant","reasoning":"r","content":"a"}])";
  EXPECT_EQ(enc(both, true, false), BOS + U + "q" + A + "<think>rc</think>a" + EOS);  // reasoning_content wins
  EXPECT_EQ(enc(alias, true, false), BOS + U + "q" + A + "<think>r</think>a" + EOS);
}

// ---- §2.8 history tool-call arguments ------------------------------------------------------

std::string one_call(const char* args_json) {
  const std::string m = std::string(R"([{"role":"user","content":"q"},{"role":"assistant","content":"",
      "tool_calls":[{"type":"function","function":{"name":"f","arguments":)") + args_json + "}}]}]";
  const std::string out = enc(m.c_str(), false);
  const std::string head = "<｜DSML｜invoke name=\"f\">\n";
  const auto s = out.find(head) + head.size();
  return out.substr(s, out.find("\n</｜DSML｜invoke>") - s);
}

TEST(chat_encoding, ArgumentsToDsml) {
  const std::string P = "<｜DSML｜parameter name=\"";
  EXPECT_EQ(one_call(R"("{\"z\": \"He said \\\"hi\\\"\\n<b>\", \"a\": [1, 2], \"n\": 2, \"t\": true, \"o\": {\"k\":1.50}, \"u\": null}")"),
            P + "z\" string=\"true\">He said \"hi\"\n<b></｜DSML｜parameter>\n" +
                P + "a\" string=\"false\">[1, 2]</｜DSML｜parameter>\n" +
                P + "n\" string=\"false\">2</｜DSML｜parameter>\n" +
                P + "t\" string=\"false\">true</｜DSML｜parameter>\n" +
                P + "o\" string=\"false\">{\"k\": 1.5}</｜DSML｜parameter>\n" +
                P + "u\" string=\"false\">null</｜DSML｜parameter>");
  EXPECT_EQ(one_call(R"("not json")"), P + "arguments\" string=\"true\">not json</｜DSML｜parameter>");
  EXPECT_EQ(one_call(R"({"city":"Paris"})"), P + "city\" string=\"true\">Paris</｜DSML｜parameter>");
  EXPECT_EQ(one_call(R"("")"), "");
  EXPECT_EQ(one_call("null"), "");
  EXPECT_THROW(one_call(R"("[1, 2]")"), Error);
}

// ---- §2.9 tools block -------------------------------------------------------------------------

TEST(chat_encoding, RequestToolsInsertedAsEmptySystem) {
  ojson with_tools = J(R"([{"role":"user","content":"q"}])");
  attach_tools(with_tools, J(R"([{"type":"function","function":{"name":"f","description":"Ünïcode ☃","parameters":{"type":"object"}}}])"));
  ojson explicit_sys = J(R"([{"role":"system","content":"","tools":[{"type":"function","function":{"name":"f","description":"Ünïcode ☃","parameters":{"type":"object"}}}]},{"role":"user","content":"q"}])");
  EncodeOptions o;
  const std::string a = encode_messages(with_tools, o), b = encode_messages(explicit_sys, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.substr(0, BOS.size() + 10), BOS + "\n\n## Tools");
  EXPECT_NE(a.find("\n\n{\"name\": \"f\", \"description\": \"Ünïcode ☃\", \"parameters\": {\"type\": \"object\"}}\n\nYou MUST strictly"),
            std::string::npos);
  EXPECT_NE(a.find("tool calls.\n" + U + "q" + A + "<think>"), std::string::npos);
  ojson bad = J(R"([{"role":"user","content":"q"}])");
  EXPECT_THROW(attach_tools(bad, J(R"([{"type":"retrieval"}])")), Error);
}

TEST(chat_encoding, ResponseFormatBlock) {
  EXPECT_EQ(enc(R"([{"role":"system","content":"S","response_format":{"type":"json_object"}},{"role":"user","content":"q"}])", false),
            BOS + "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"json_object\"}" + U +
                "q" + A + "</think>");
  EXPECT_EQ(json_dumps(response_format_schema(J(R"({"type":"json_object"})"))), R"({"type": "object"})");
  EXPECT_EQ(json_dumps(response_format_schema(J(R"({"type":"json_schema","json_schema":{"name":"x","schema":{"b":1,"a":2}}})"))),
            R"({"b": 1, "a": 2})");
  EXPECT_TRUE(response_format_schema(J(R"({"type":"text"})")).is_null());
}

// ---- §2.10 effort ------------------------------------------------------------------------------

TEST(chat_encoding, EffortPrefixLengths) {
  EncodeOptions o;
  o.profile = EffortProfile::k0731;
  const ojson m = J(R"([{"role":"user","content":"test"}])");
  o.reasoning_effort = "max";
  EXPECT_EQ(codepoints(encode_messages(m, o)), 579u);
  o.reasoning_effort = "high";
  EXPECT_EQ(codepoints(encode_messages(m, o)), 529u);
  o.reasoning_effort = "low";
  EXPECT_EQ(encode_messages(m, o), BOS + U + "test" + A + "<think>");
  o.thinking_mode = ThinkingMode::kChat;
  o.reasoning_effort = "max";
  EXPECT_EQ(encode_messages(m, o), BOS + U + "test" + A + "</think>");  // never in chat mode
  EXPECT_EQ(codepoints(reasoning_effort_prefix(EffortProfile::kPreview, "max")), 476u);
  EXPECT_EQ(reasoning_effort_prefix(EffortProfile::kPreview, "high"), "");
  EXPECT_THROW(reasoning_effort_prefix(EffortProfile::kPreview, "low"), Error);
  EXPECT_THROW(reasoning_effort_prefix(EffortProfile::k0731, "ultra"), Error);
}

// ---- §2.11 JSON ----------------------------------------------------------------------------------

TEST(chat_json_dumps, MatchesPython) {
  // Right-hand sides are what CPython 3 prints for json.dumps(json.loads(lhs), ensure_ascii=False).
  const std::pair<const char*, const char*> cases[] = {
      {R"({"b": 1, "a": [true, false, null]})", R"({"b": 1, "a": [true, false, null]})"},
      {R"({"x":1.0,"y":0.1,"z":1e-5,"w":1E20,"v":1e16,"u":1e15,"t":0.0001,"s":-0.0,"r":1e5})",
       R"({"x": 1.0, "y": 0.1, "z": 1e-05, "w": 1e+20, "v": 1e+16, "u": 1000000000000000.0, "t": 0.0001, "s": -0.0, "r": 100000.0})"},
      {R"([123456789012345678, 18446744073709551615, -9223372036854775808, 1.5e-7, 1.2345678901234568e17, 3.14])",
       R"([123456789012345678, 18446744073709551615, -9223372036854775808, 1.5e-07, 1.2345678901234568e+17, 3.14])"},
      {R"(["\u0001\u001f\b\f\n\r\t\"\\/", "é☃😀", "\u007f"])", "[\"\\u0001\\u001f\\b\\f\\n\\r\\t\\\"\\\\/\", \"é☃😀\", \"\x7f\"]"},
      {R"({})", R"({})"},
      {R"([])", R"([])"},
      {R"({"a":{},"b":[{}]})", R"({"a": {}, "b": [{}]})"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(json_dumps(parse_json_ordered(in)), want) << in;
  EXPECT_EQ(python_float_repr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(python_float_repr(2.5e-300), "2.5e-300");
  EXPECT_THROW(parse_json_ordered("{bad"), Error);
  EXPECT_THROW(json_quote("\xff"), Error);
}

}  // namespace
}  // namespace dsv4
