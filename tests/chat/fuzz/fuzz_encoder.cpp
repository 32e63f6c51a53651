// Prompt-encoder fuzz target: arbitrary JSON as `messages` (and as tools) either renders
// or fails with dsv4::Error; the Python-style JSON printer re-parses to the same value.
#include <cstddef>
#include <cstdint>

#include "chat/encoding.h"
#include "chat/json_dumps.h"
#include "core/error.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  dsv4::ojson j;
  try {
    j = dsv4::parse_json_ordered(text);
  } catch (const dsv4::Error&) {
    return 0;
  }
  try {
    const std::string dumped = dsv4::json_dumps(j);
    try {
      const auto back = dsv4::ojson::parse(dumped);
      FUZZ_ASSERT(back == j || dumped.find("Infinity") != std::string::npos || dumped.find("NaN") != std::string::npos);
    } catch (const dsv4::ojson::exception&) {
      FUZZ_ASSERT(dumped.find("Infinity") != std::string::npos || dumped.find("NaN") != std::string::npos);
    }
  } catch (const dsv4::Error&) {
    // invalid UTF-8 inside strings is rejected
  }
  dsv4::EncodeOptions o;
  o.thinking_mode = (flags & 1) ? dsv4::ThinkingMode::kThinking : dsv4::ThinkingMode::kChat;
  o.drop_thinking = flags & 2;
  o.developer_as_system = flags & 4;
  o.profile = (flags & 8) ? dsv4::EffortProfile::k0731 : dsv4::EffortProfile::kPreview;
  static const char* efforts[] = {"", "high", "max", "low"};
  o.reasoning_effort = efforts[(flags >> 4) & 3];
  try {
    dsv4::ojson msgs = j;
    if ((flags & 0x40) && j.is_object() && j.contains("messages") && j.contains("tools")) {
      msgs = j["messages"];
      dsv4::attach_tools(msgs, j["tools"]);
    }
    const std::string p = dsv4::encode_messages(msgs, o);
    if (o.add_bos) FUZZ_ASSERT(p.rfind(dsv4::dsml::kBos, 0) == 0);
  } catch (const dsv4::Error&) {
  }
  return 0;
}
