// OpenAI request bodies → GenerationPlan, with every check a client can fail turned into a
// 4xx ApiError (OpenAI error shape) naming the field: types, ranges, unknown model (404),
// prompt longer than the context, unsupported options (n > 1, best_of, logprobs, ...).
#pragma once
#include "chat/tokenizer.h"
#include "server/generation_plan.h"

namespace dsv4 {

// POST /v1/chat/completions (serving.md §4, §5.2-§5.4).
GenerationPlan parse_chat_request(const ojson& body, const ApiConfig& cfg, const Tokenizer& tok);
// POST /v1/completions (§5.5): prompt as a string or token ids.
GenerationPlan parse_completion_request(const ojson& body, const ApiConfig& cfg, const Tokenizer& tok);

// §4.2: the client's reasoning_effort → "none" (chat mode), "low", "high" or "max".
std::string normalize_reasoning_effort(const std::string& effort);

}  // namespace dsv4
