// One request running on the engine, seen from an HTTP handler: submits the plan, then
// turns the engine's token events (detokenized on the engine thread) into response deltas —
// through the §3.3 stream parser for chat (reasoning / content / tool calls), as plain text
// for completions. Streaming and non-streaming responses are built from the same deltas.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/stream_parser.h"
#include "chat/tokenizer.h"
#include "runtime/engine.h"
#include "server/generation_plan.h"
#include "server/logprobs_json.h"
#include "server/metrics.h"

namespace dsv4 {

struct OutputDelta {
  enum class Kind { kReasoning, kContent, kToolBegin, kToolArgs };
  Kind kind;
  int index = -1;    // tool call index
  std::string text;  // reasoning/content text, tool name (begin) or arguments fragment
};

struct GenerationSummary {
  std::string finish_reason;  // stop, length, tool_calls, abort (cancelled), error
  std::string error;          // when finish_reason == "error"
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0, reasoning_tokens = 0;
  int tool_calls = 0;
};

// Tokenizer ids → engine ids: identical (serve refuses a tokenizer larger than the model's vocab;
// the engine rejects any id out of range with a clear error).
struct TokenMap {
  int64_t model_vocab = 0;
  int32_t to_engine(int32_t id) const { return id; }
};

class Generation {
 public:
  // Submits to the engine; throws ApiError(400) when the engine rejects the request.
  Generation(Engine& engine, const Tokenizer& tok, const GenerationPlan& plan, TokenMap map, Metrics* metrics);
  ~Generation();  // cancels the engine request if it is still running
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Waits up to `wait` for engine events, appends the deltas they produce, and returns true
  // once the request has finished (then summary() is final).
  bool poll(std::chrono::milliseconds wait, std::vector<OutputDelta>& out);
  // Thread-safe: the engine frees its state; poll() then finishes with "abort".
  void cancel();
  // The logprobs of the tokens polled since the last call (when the plan asked for them).
  std::vector<LogprobEntry> take_logprobs() { return std::exchange(logprobs_, {}); }
  bool finished() const { return finished_; }
  const GenerationSummary& summary() const { return sum_; }
  uint64_t engine_id() const { return id_; }

 private:
  struct Inbox;
  void handle(const TokenEvent& e, std::vector<OutputDelta>& out);
  void parsed(std::vector<StreamEvent>& evs, std::vector<OutputDelta>& out);
  std::string token_text(int32_t id) const;

  Engine* engine_;
  const Tokenizer* tok_;
  GenerationPlan plan_;
  Metrics* metrics_;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<StreamParser> parser_;  // chat only
  std::vector<OutputDelta> pending_;      // from the forced tool-call prefix
  std::vector<LogprobEntry> logprobs_;
  uint64_t id_ = 0;
  std::atomic<bool> finished_{false};  // read by cancel() from other threads
  bool reasoning_open_ = false;
  int32_t think_close_ = -1;
  GenerationSummary sum_;
  std::chrono::steady_clock::time_point t0_, last_token_;
  RequestTimings timings_;
};

}  // namespace dsv4
