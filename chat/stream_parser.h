// Incremental model-output parser: the §3.3 state machine (mirrors deepseek-recipe's
// stream/state_machine.rs). Feed detokenized text in chunks of any size — down to single
// bytes — and get reasoning deltas, content deltas and tool-call deltas. A partial marker
// at the end of a chunk is held back until it can be decided, so no DSML markup, `</think>`
// or EOS ever reaches reasoning or content, and deltas never split a UTF-8 character.
// Malformed output never throws: whatever parses is returned and `anomalies()` counts the
// rest. The final message (result()) does not depend on how the text was chunked.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "chat/output_parser.h"

namespace dsv4 {

struct StreamEvent {
  enum class Kind {
    kReasoning,      // text: reasoning_content delta
    kContent,        // text: content delta
    kToolCallBegin,  // index, text = function name (arguments start as "")
    kToolCallArgs,   // index, text = arguments fragment
    kToolCallEnd,    // index
  };
  Kind kind;
  int index = -1;
  std::string text;
  bool operator==(const StreamEvent&) const = default;
};

struct StreamParserOptions {
  ThinkingMode mode = ThinkingMode::kThinking;
  // Recipe behaviour (§3.2 recommendation): drop leading newlines of reasoning and content,
  // and the newlines before `</think>`. false = raw: keep them, and drop only the "\n\n"
  // separator before a tool block, which makes results equal to parse_completion_strict.
  bool strip_newlines = true;
  // Stop strings, matched only in content (§4.5); the match is not emitted.
  std::vector<std::string> stop;
};

class StreamParser {
 public:
  explicit StreamParser(StreamParserOptions opt = {});

  // Appends the events produced by `chunk` to `out`.
  void feed(std::string_view chunk, std::vector<StreamEvent>& out);
  // End of output: flushes held-back text and closes an unfinished tool call.
  void finish(std::vector<StreamEvent>& out);

  // Everything emitted so far, folded into one message.
  const ParsedMessage& result() const { return msg_; }
  bool finished() const { return state_ == State::kFinished; }
  bool stopped_by_stop_string() const { return stop_hit_; }
  int anomalies() const { return anomalies_; }  // stray markers, text after the end, ...

  // Convenience: whole text at once.
  static ParsedMessage parse(std::string_view text, const StreamParserOptions& opt);

 private:
  enum class State { kReasoning, kContent, kToolCalls, kToolName, kArgs, kRawBody, kParamName, kParamType, kStringValue,
                     kRawValue, kFinished };
  void run(bool eof, std::vector<StreamEvent>& out);
  bool step_text(bool eof, std::size_t limit, std::vector<StreamEvent>& out);
  bool step_tool(bool eof, std::size_t limit, std::vector<StreamEvent>& out);
  void emit_text(std::string_view s, std::vector<StreamEvent>& out);
  void emit_args(std::string_view s, std::vector<StreamEvent>& out);
  void close_call(bool add_brace, std::vector<StreamEvent>& out);
  void close_open(std::vector<StreamEvent>& out);

  StreamParserOptions opt_;
  State state_;
  bool leading_ = true;
  bool first_param_ = true;
  bool stop_hit_ = false;
  int anomalies_ = 0;
  int call_ = -1;
  std::string buf_;   // unprocessed input
  std::string acc_;   // tool / parameter name being read
  std::string after_; // start of what followed the end of the output
  ParsedMessage msg_;
};

}  // namespace dsv4
