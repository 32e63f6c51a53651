// Model output -> assistant message. parse_completion_strict is the reference
// parse_message_from_completion_text of serving.md §3.1: it accepts exactly the §3 grammar
// and throws dsv4::Error on anything else (used to validate output and as the oracle the
// streaming parser is tested against). Servers should use StreamParser (§3.3), which
// never fails, for both streaming and non-streaming responses.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/encoding.h"

namespace dsv4 {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object text, e.g. {"city": "Paris", "days": 2}
  bool operator==(const ToolCall&) const = default;
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ParsedMessage&) const = default;
};

// `text` is the whole completion, normally ending with EOS (EOS may be missing only after
// a tool-call block, as in the reference).
ParsedMessage parse_completion_strict(std::string_view text, ThinkingMode mode);

// OpenAI-shaped JSON of a parsed message (the reference parser's dict, no ids).
ojson to_openai_json(const ParsedMessage& m);

}  // namespace dsv4
