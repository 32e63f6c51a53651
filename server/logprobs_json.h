// Token logprobs of a generation, with their text, in OpenAI's two response shapes: chat's
// {"content": [{token, logprob, bytes, top_logprobs: [...]}]} and the legacy completions
// {"tokens", "token_logprobs", "top_logprobs" (token → logprob dicts), "text_offset"}.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "chat/json_dumps.h"

namespace dsv4 {

struct TokenText {
  std::string token;  // the tokenizer's decode of the single id
  float logprob = 0;
};

struct LogprobEntry {
  TokenText chosen;
  std::vector<TokenText> top;  // most likely first
};

ojson chat_logprobs(const std::vector<LogprobEntry>& entries);
// text_offset: where the first token starts in the choice's text; advanced past the entries
// (code points, as Python's len() in vLLM/OpenAI) so streamed chunks continue it.
ojson completion_logprobs(const std::vector<LogprobEntry>& entries, int64_t& text_offset);

}  // namespace dsv4
