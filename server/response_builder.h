// OpenAI response JSON from generation deltas: chat.completion / chat.completion.chunk
// (serving.md §5.2-§5.4, §10.2-§10.3) and text_completion (§5.5). One builder per request;
// it owns the response id, `created` and the generated tool-call ids.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "server/generation.h"

namespace dsv4 {

class ResponseBuilder {
 public:
  // logprobs: the request asked for them (choices carry an object, else null).
  ResponseBuilder(bool chat, std::string model, bool logprobs = false);

  // Streaming: SSE text for the opening chunk (chat: role), for deltas, and for the end
  // (finish chunk, optional usage chunk, [DONE]). An error ends the stream with an error event.
  // The logprobs of one poll ride on the last chunk of its deltas (a chunk with an empty
  // delta when the poll's text is held back), so the chunks' logprobs concatenate to the
  // non-streamed list.
  std::string stream_open() const;
  std::string stream_deltas(const std::vector<OutputDelta>& d, const std::vector<LogprobEntry>& lp = {});
  std::string stream_close(const GenerationSummary& s, bool include_usage) const;

  // Non-streaming: accumulate, then the whole response.
  void add(const std::vector<OutputDelta>& d, const std::vector<LogprobEntry>& lp = {});
  ojson final_response(const GenerationSummary& s) const;

  static ojson usage(const GenerationSummary& s);
  const std::string& id() const { return id_; }

 private:
  ojson chunk(ojson choice) const;
  ojson logprobs_json(const std::vector<LogprobEntry>& lp);
  const std::string& call_id(int index);

  bool chat_, logprobs_;
  int64_t text_offset_ = 0;  // completions: where the next token's text starts
  std::string model_, id_;
  int64_t created_;
  std::vector<std::string> call_ids_;
  // Non-streaming accumulation.
  std::string reasoning_, content_;
  std::vector<std::pair<std::string, std::string>> calls_;  // name, arguments
  std::vector<LogprobEntry> lp_;
};

// "call_" + 24 hex digits (vLLM's form), random.
std::string make_tool_call_id();
std::string random_hex(int digits);

}  // namespace dsv4
