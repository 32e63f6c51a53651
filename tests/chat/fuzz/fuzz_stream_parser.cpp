// Output-parser fuzz target: the streaming parser never fails, its result does not depend
// on the chunking, its text deltas are valid UTF-8 for valid input, and (raw mode) it
// agrees with the strict parser whenever the strict parser accepts the text (and no
// tool-call value contains DSML markup, where the two are specified to differ).
#include <cstddef>
#include <cstdint>

#include "chat/json_dumps.h"
#include "chat/output_parser.h"
#include "chat/stream_parser.h"
#include "chat/utf8.h"
#include "core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0], seed = data[1];
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  dsv4::StreamParserOptions o;
  o.mode = (flags & 1) ? dsv4::ThinkingMode::kThinking : dsv4::ThinkingMode::kChat;
  o.strip_newlines = flags & 2;
  if (flags & 4) o.stop = {"STOP", "\n\n"};

  std::vector<dsv4::StreamEvent> whole_ev;
  dsv4::StreamParser whole(o);
  whole.feed(text, whole_ev);
  whole.finish(whole_ev);

  std::vector<dsv4::StreamEvent> ev;
  dsv4::StreamParser p(o);
  uint32_t r = seed * 2654435761u + 1;
  for (size_t i = 0; i < text.size();) {
    r = r * 1103515245u + 12345u;
    const size_t n = 1 + (r >> 16) % 9;
    p.feed(std::string_view(text).substr(i, n), ev);
    i += n;
  }
  p.finish(ev);
  FUZZ_ASSERT(p.result() == whole.result());
  FUZZ_ASSERT(p.anomalies() == whole.anomalies());
  if (dsv4::utf8_valid(text)) {
    for (const auto& e : ev)
      if (e.kind == dsv4::StreamEvent::Kind::kContent || e.kind == dsv4::StreamEvent::Kind::kReasoning)
        FUZZ_ASSERT(dsv4::utf8_valid(e.text));
  }
  if (!o.strip_newlines && o.stop.empty()) {
    try {
      const auto strict = dsv4::parse_completion_strict(text, o.mode);
      // Known, specified divergence: the strict parser ends a value at "/｜DSML｜parameter",
      // the state machine (§3.3) at any "</｜DSML｜", so values holding DSML markup differ.
      bool markup_in_call = false;
      for (const auto& c : strict.tool_calls)
        markup_in_call |= (c.name + c.arguments).find("｜DSML｜") != std::string::npos;
      if (markup_in_call) return 0;
      if (!(strict == whole.result())) {
        std::fprintf(stderr, "input: %s\nstrict: %s\nstream: %s\n", dsv4::json_quote(text).c_str(),
                     dsv4::to_openai_json(strict).dump().c_str(), dsv4::to_openai_json(whole.result()).dump().c_str());
      }
      FUZZ_ASSERT(strict == whole.result());
    } catch (const dsv4::Error&) {
    }
  }
  return 0;
}
