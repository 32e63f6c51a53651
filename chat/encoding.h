// DeepSeek-V4 prompt rendering (serving.md §2): a faithful port of the reference
// `encode_messages` of encoding_dsv4.py, plus the input normalization of §4.6 that an
// OpenAI-compatible server needs (developer -> system, content parts, `reasoning` alias,
// tolerant tool-call arguments). Messages are OpenAI-shaped JSON (insertion-ordered).
#pragma once
#include <string>

#include "chat/json_dumps.h"

namespace dsv4 {

enum class ThinkingMode { kChat, kThinking };

// The two encoder profiles sharing model_type deepseek_v4; they differ only in the
// reasoning-effort prefix (§2.10).
enum class EffortProfile {
  kPreview,  // original V4-Pro/Flash: effort "", "high" (no prefix) or "max"
  k0731,     // V4-Flash-0731: effort "" (= "low"), "low", "high", "max"
};

struct EncodeOptions {
  ThinkingMode thinking_mode = ThinkingMode::kThinking;
  bool drop_thinking = true;  // forced off when any message carries tools (§2.5)
  bool add_bos = true;        // only when there is no context
  std::string reasoning_effort;  // "" = profile default
  EffortProfile profile = EffortProfile::kPreview;
  // §4.6.1: the DeepSeek API has no `developer` role; OpenAI clients mean "system". When
  // false, `developer` keeps the encoder's internal semantics (a user turn that is dropped
  // from history in thinking mode).
  bool developer_as_system = true;
  // §2.12: how OpenAI text parts of one message are joined.
  std::string content_part_separator = "\n\n";
};

namespace dsml {
inline constexpr const char* kBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* kEos = "<｜end▁of▁sentence｜>";
inline constexpr const char* kUser = "<｜User｜>";
inline constexpr const char* kAssistant = "<｜Assistant｜>";
inline constexpr const char* kThinkOpen = "<think>";
inline constexpr const char* kThinkClose = "</think>";
inline constexpr const char* kDsml = "｜DSML｜";
inline constexpr const char* kLatestReminder = "<｜latest_reminder｜>";
}  // namespace dsml

// Renders `messages` (after `context`, which is an already-rendered prefix: no BOS, no
// effort prefix) into the prompt string. Errors (unknown role, empty developer content,
// bad effort, ...) throw dsv4::Error.
std::string encode_messages(const ojson& messages, const EncodeOptions& opt, const ojson& context = ojson::array());

// Request-level `tools` go onto the first system/developer message, or a new empty system
// message at index 0 (vLLM placement, §2.9). `tools` is the OpenAI list.
void attach_tools(ojson& messages, const ojson& tools);

// The schema printed for a request's response_format (§2.12 recommendation): json_object
// -> {"type":"object"}, json_schema -> its inner schema, text/absent -> null.
ojson response_format_schema(const ojson& response_format);

// Reasoning-effort prefix text for a profile/effort ("" when none); throws on an unknown effort.
std::string reasoning_effort_prefix(EffortProfile profile, const std::string& effort);

}  // namespace dsv4
