// A generation request as the engine takes it (token ids in, token events out) and the events
// it streams back. The server maps OpenAI fields onto these; see runtime/engine.h.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace dsv4 {

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct StopConditions {
  int64_t max_tokens = -1;              // -1: up to the context limit
  std::vector<int32_t> stop_token_ids;  // in addition to EOS
  bool ignore_eos = false;
  std::vector<std::string> stop_strings;  // need Request::detokenize
  bool include_stop_str_in_output = false;
};

// The server's incremental detokenizer for one request (e.g. a chat StreamDetokenizer):
// push(token) returns the text the token completes; finish() flushes what is left. Stop
// strings are matched on this text.
struct TextHook {
  std::function<std::string(int32_t)> push;
  std::function<std::string()> finish;
};

struct TokenEvent {
  uint64_t request_id = 0;
  int32_t token = -1;  // -1 on an event that only finishes (cancel, error)
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  std::string text;  // detokenised text released by this event (stop-string safe); "" without a hook
  FinishReason finish = FinishReason::None;  // set on the request's last event
  // On the last event:
  std::string stop_string;       // the stop string that matched
  int32_t stop_token = -1;       // or the stop token id (EOS or stop_token_ids)
  std::string error;             // FinishReason::Error
  int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
};

using EventCallback = std::function<void(const TokenEvent&)>;

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  StopConditions stop;
  TextHook detokenize;   // optional unless stop_strings are given
  EventCallback on_event;  // runs on the engine thread: keep it short (push to a queue)
  // Debug/tests: the raw logits row each token is sampled from.
  std::function<void(std::span<const float>)> on_logits;
};

// A thread-safe queue of events, for a consumer thread (an SSE writer) that blocks on pop().
class EventQueue {
 public:
  EventCallback callback() {
    return [this](const TokenEvent& e) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        q_.push_back(e);
      }
      cv_.notify_all();
    };
  }
  TokenEvent pop() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !q_.empty(); });
    TokenEvent e = std::move(q_.front());
    q_.pop_front();
    return e;
  }
  std::optional<TokenEvent> try_pop() {
    std::lock_guard<std::mutex> lk(mu_);
    if (q_.empty()) return std::nullopt;
    TokenEvent e = std::move(q_.front());
    q_.pop_front();
    return e;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> q_;
};

}  // namespace dsv4
