// A validated API request, ready for the engine: prompt ids, sampling, stop conditions and
// how to turn the output back into a response. Built by parse_chat_request /
// parse_completion_request (request_parse.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "chat/encoding.h"
#include "runtime/request.h"
#include "runtime/sampler.h"

namespace dsv4 {

// Server-wide settings request parsing depends on.
struct ApiConfig {
  std::string served_model_name = "dsv4";
  int64_t max_model_len = 0;  // the engine's context limit
  bool default_thinking = true;  // serving.md §4.1: the hosted API defaults to thinking
  EffortProfile effort_profile = EffortProfile::kPreview;
  // §4.3: in thinking mode sampling is fixed to temperature 1 / top_p 1 / no penalties
  // (hosted API parity) unless the request sets "deepseek_v4_sampling_override": false.
  bool thinking_sampling_override = true;
  bool completions_add_bos = true;  // §5.5: prepend BOS to a text prompt that lacks it
};

struct GenerationPlan {
  bool chat = true;
  std::vector<int32_t> prompt;  // tokenizer ids
  SamplingParams sampling;
  StopConditions stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage

  // Chat only.
  ThinkingMode mode = ThinkingMode::kChat;
  bool parse_tools = false;        // tools present and tool_choice != "none"
  bool parallel_tool_calls = true;  // false: only the first invoke is returned
  bool include_reasoning = true;    // false: reasoning is parsed but not returned
  // tool_choice required/named (§4.4 b): the DSML opening appended to the prompt; the output
  // parser reads it first so the response continues inside the tool-call block.
  std::string forced_prefix;
};

}  // namespace dsv4
