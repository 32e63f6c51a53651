#include "chat/output_parser.h"

#include <map>

#include "chat/json_dumps.h"
#include "core/error.h"

namespace dsv4 {

namespace {

const std::string kEos = dsml::kEos, kBos = dsml::kBos;
const std::string kToolStart = "\n\n<｜DSML｜tool_calls";
const std::string kToolEnd = "</｜DSML｜tool_calls>";
const std::string kInvoke = "<｜DSML｜invoke", kInvokeEnd = "</｜DSML｜invoke";
const std::string kParam = "<｜DSML｜parameter", kParamEnd = "/｜DSML｜parameter";

// The reference's _read_until_stop: text up to the earliest stop; *matched = -1 if none.
std::string_view read_until(std::string_view text, std::size_t& pos, std::initializer_list<const std::string*> stops,
                            int* matched) {
  std::size_t best = std::string_view::npos;
  int which = -1, k = 0;
  for (const std::string* s : stops) {
    const std::size_t p = text.find(*s, pos);
    if (p != std::string_view::npos && p < best) {
      best = p;
      which = k;
    }
    ++k;
  }
  *matched = which;
  if (which < 0) {
    const std::string_view rest = text.substr(pos);
    pos = text.size();
    return rest;
  }
  const std::string_view before = text.substr(pos, best - pos);
  pos = best + (*std::next(stops.begin(), which))->size();
  return before;
}

// Python's str.isspace() for the characters a name prefix could plausibly hold.
std::size_t py_space_len(std::string_view s) {
  if (s.empty()) return 0;
  const auto c = static_cast<unsigned char>(s[0]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  static const char* multi[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF",
                                "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (const char* m : multi)
    if (s.substr(0, std::char_traits<char>::length(m)) == m) return std::char_traits<char>::length(m);
  if (s.size() >= 3 && s.substr(0, 2) == "\xE2\x80" && static_cast<unsigned char>(s[2]) >= 0x80 &&
      static_cast<unsigned char>(s[2]) <= 0x8A)
    return 3;  // U+2000..U+200A
  return 0;
}

// re.findall(r'^\s*name="(.*?)">\n$', s, DOTALL): `$` also matches before a final "\n".
std::string tool_name_of(std::string_view s) {
  std::string_view r = s;
  while (std::size_t n = py_space_len(r)) r.remove_prefix(n);
  DSV4_CHECK(r.substr(0, 6) == "name=\"", "tool name format error: '", s, "'");
  r.remove_prefix(6);
  if (r.size() >= 4 && r.substr(r.size() - 4) == "\">\n\n") return std::string(r.substr(0, r.size() - 4));
  if (r.size() >= 3 && r.substr(r.size() - 3) == "\">\n") return std::string(r.substr(0, r.size() - 3));
  fail("tool name format error: '", s, "'");
}

// re.findall(r'^ name="(.*?)" string="(true|false)">(.*?)<$', s, DOTALL).
void param_of(std::string_view s, std::string* name, bool* is_string, std::string* value) {
  DSV4_CHECK(s.substr(0, 7) == " name=\"", "parameter format error: '", s, "'");
  std::string_view body = s.substr(7);
  std::size_t end;
  if (body.size() >= 2 && body.substr(body.size() - 2) == "<\n")
    end = body.size() - 2;
  else if (!body.empty() && body.back() == '<')
    end = body.size() - 1;
  else
    fail("parameter format error: '", s, "'");
  const std::size_t t = body.find("\" string=\"true\">"), f = body.find("\" string=\"false\">");
  const std::size_t p = std::min(t, f);
  const std::size_t tag = (p == t) ? 16 : 17;
  DSV4_CHECK(p != std::string_view::npos && p + tag <= end, "parameter format error: '", s, "'");
  *name = std::string(body.substr(0, p));
  *is_string = (p == t);
  *value = std::string(body.substr(p + tag, end - p - tag));
}

}  // namespace

ParsedMessage parse_completion_strict(std::string_view text, ThinkingMode mode) {
  ParsedMessage out;
  std::size_t pos = 0;
  int m = -1;
  const std::string think_end = dsml::kThinkClose;
  if (mode == ThinkingMode::kThinking) {
    out.reasoning_content = std::string(read_until(text, pos, {&think_end, &kToolStart}, &m));
    DSV4_CHECK(m == 0, "invalid thinking format: missing </think>");
  }
  out.content = std::string(read_until(text, pos, {&kEos, &kToolStart}, &m));
  const bool tools = (m == 1);
  DSV4_CHECK(tools || m == 0, "invalid format: missing EOS");
  int stop = m == 0 ? 0 : -1;  // 0: ended on EOS, -1: ended at end of text
  if (tools) {
    bool closed = false;
    while (pos < text.size()) {
      std::string_view skipped = read_until(text, pos, {&kInvoke, &kToolEnd}, &m);
      DSV4_CHECK(skipped == ">\n", "tool call format error: expected '>\\n' but got '", skipped, "'");
      if (m == 1) {
        closed = true;
        break;
      }
      DSV4_CHECK(m == 0, "missing special token in tool calls");
      const std::string name = tool_name_of(read_until(text, pos, {&kParam, &kInvokeEnd}, &m));
      std::map<std::string, int> seen;
      std::string args = "{";
      while (m == 0) {
        std::string pname, value;
        bool is_str = false;
        param_of(read_until(text, pos, {&kParamEnd}, &m), &pname, &is_str, &value);
        DSV4_CHECK(seen.emplace(pname, 1).second, "duplicate parameter name: '", pname, "'");
        if (args.size() > 1) args += ", ";
        args += json_quote(pname) + ": " + (is_str ? json_quote(value) : value);
        skipped = read_until(text, pos, {&kParam, &kInvokeEnd}, &m);
        DSV4_CHECK(skipped == ">\n", "parameter format error: expected '>\\n' but got '", skipped, "'");
      }
      out.tool_calls.push_back({name, args + "}"});
    }
    // Stricter than the reference, which also accepts a block cut off after a parameter.
    DSV4_CHECK(closed, "tool-call block is not closed with ", kToolEnd);
    const std::string_view after = read_until(text, pos, {&kEos}, &m);
    DSV4_CHECK(after.empty(), "unexpected content after tool calls: '", after, "'");
    stop = m;
  }
  DSV4_CHECK(pos == text.size() && (stop == 0 || stop == -1), "unexpected content at end");
  for (const char* sp : {dsml::kBos, dsml::kEos, dsml::kThinkOpen, dsml::kThinkClose, dsml::kDsml}) {
    DSV4_CHECK(out.content.find(sp) == std::string::npos && out.reasoning_content.find(sp) == std::string::npos,
               "unexpected special token '", sp, "' in content");
  }
  return out;
}

ojson to_openai_json(const ParsedMessage& m) {
  ojson calls = ojson::array();
  for (const auto& c : m.tool_calls)
    calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return {{"role", "assistant"}, {"content", m.content}, {"reasoning_content", m.reasoning_content}, {"tool_calls", calls}};
}

}  // namespace dsv4
