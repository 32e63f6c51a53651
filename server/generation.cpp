#include "server/generation.h"

#include <condition_variable>
#include <deque>
#include <mutex>

#include "chat/detokenizer.h"
#include "core/error.h"
#include "server/api_error.h"

namespace dsv4 {

// Written by the engine thread, read by the handler; shared so that a handler that leaves
// early (client gone) does not free what the engine still writes to.
struct Generation::Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> q;
};

Generation::Generation(Engine& engine, const Tokenizer& tok, const GenerationPlan& plan, TokenMap map, Metrics* metrics)
    : engine_(&engine), tok_(&tok), plan_(plan), metrics_(metrics), inbox_(std::make_shared<Inbox>()) {
  t0_ = std::chrono::steady_clock::now();
  Request r;
  for (int32_t id : plan.prompt) r.prompt.push_back(map.to_engine(id));
  r.sampling = plan.sampling;
  for (auto& [id, b] : r.sampling.logit_bias) id = map.to_engine(id);
  r.stop = plan.stop;
  for (int32_t& id : r.stop.stop_token_ids) id = map.to_engine(id);
  // The detokenizer runs on the engine thread so stop strings are matched there.
  auto detok = std::make_shared<StreamDetokenizer>(tok, false);
  const Tokenizer* tk = &tok;
  r.detokenize.push = [detok, tk](int32_t id) {
    return tk->is_valid_id(static_cast<TokenId>(id)) ? detok->push(static_cast<TokenId>(id)) : std::string();
  };
  r.detokenize.finish = [detok] { return detok->finish(); };
  std::shared_ptr<Inbox> in = inbox_;
  r.on_event = [in](const TokenEvent& e) {
    {
      std::lock_guard<std::mutex> lk(in->mu);
      in->q.push_back(e);
    }
    in->cv.notify_all();
  };
  if (plan.chat) {
    StreamParserOptions po;
    po.mode = plan.mode;
    parser_ = std::make_unique<StreamParser>(po);
    reasoning_open_ = plan.mode == ThinkingMode::kThinking;
    if (auto id = tok.token_to_id(dsml::kThinkClose)) think_close_ = static_cast<int32_t>(*id);
    if (!plan.forced_prefix.empty()) {  // the call header of a named tool_choice comes from here
      std::vector<StreamEvent> evs;
      parser_->feed(plan.forced_prefix, evs);
      parsed(evs, pending_);
    }
  }
  try {
    id_ = engine.submit(std::move(r));
  } catch (const Error& e) {
    bad_request(e.what());
  }
}

Generation::~Generation() {
  if (finished_) return;
  engine_->cancel(id_);
  if (metrics_) {  // the client left before the end: count it as aborted
    timings_.e2e = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    timings_.prompt_tokens = static_cast<int64_t>(plan_.prompt.size());
    timings_.generation_tokens = timings_.ttft < 0 ? 0 : static_cast<int64_t>(timings_.itl.size()) + 1;
    timings_.finish_reason = "abort";
    metrics_->on_request_finished(timings_);
  }
}

void Generation::cancel() {
  if (!finished_) engine_->cancel(id_);
}

bool Generation::poll(std::chrono::milliseconds wait, std::vector<OutputDelta>& out) {
  if (!pending_.empty()) {
    out.insert(out.end(), pending_.begin(), pending_.end());
    pending_.clear();
  }
  if (finished_) return true;
  std::deque<TokenEvent> evs;
  {
    std::unique_lock<std::mutex> lk(inbox_->mu);
    inbox_->cv.wait_for(lk, wait, [&] { return !inbox_->q.empty(); });
    evs.swap(inbox_->q);
  }
  for (const TokenEvent& e : evs) {
    if (finished_) break;
    handle(e, out);
  }
  return finished_;
}

void Generation::parsed(std::vector<StreamEvent>& evs, std::vector<OutputDelta>& out) {
  for (StreamEvent& e : evs) {
    switch (e.kind) {
      case StreamEvent::Kind::kReasoning:
        if (plan_.include_reasoning) out.push_back({OutputDelta::Kind::kReasoning, -1, std::move(e.text)});
        break;
      case StreamEvent::Kind::kContent:
        out.push_back({OutputDelta::Kind::kContent, -1, std::move(e.text)});
        break;
      case StreamEvent::Kind::kToolCallBegin:
      case StreamEvent::Kind::kToolCallArgs: {
        // tool_choice "none" strips tool markup (§4.4); parallel_tool_calls=false keeps the first.
        if (!plan_.parse_tools || (!plan_.parallel_tool_calls && e.index > 0)) break;
        const bool begin = e.kind == StreamEvent::Kind::kToolCallBegin;
        if (begin) ++sum_.tool_calls;
        out.push_back({begin ? OutputDelta::Kind::kToolBegin : OutputDelta::Kind::kToolArgs, e.index, std::move(e.text)});
        break;
      }
      case StreamEvent::Kind::kToolCallEnd:
        break;
    }
  }
  evs.clear();
}

std::string Generation::token_text(int32_t id) const {
  const auto t = static_cast<TokenId>(id);
  return tok_->is_valid_id(t) ? tok_->decode(std::span<const TokenId>(&t, 1)) : std::string();
}

void Generation::handle(const TokenEvent& e, std::vector<OutputDelta>& out) {
  const auto now = std::chrono::steady_clock::now();
  if (e.token >= 0 && plan_.sampling.logprobs) {
    LogprobEntry le{{token_text(e.token), e.logprob}, {}};
    for (const TokenLogprob& t : e.top_logprobs) le.top.push_back({token_text(t.token), t.logprob});
    logprobs_.push_back(std::move(le));
  }
  if (e.token >= 0) {
    if (timings_.ttft < 0) {
      timings_.ttft = std::chrono::duration<double>(now - t0_).count();
    } else {
      timings_.itl.push_back(std::chrono::duration<double>(now - last_token_).count());
    }
    last_token_ = now;
    // Reasoning tokens: everything up to and including </think> (the mode's first token).
    if (reasoning_open_) {
      ++sum_.reasoning_tokens;
      if (e.token == think_close_) reasoning_open_ = false;
    }
  }
  std::vector<StreamEvent> evs;
  if (!e.text.empty()) {
    if (parser_) {
      parser_->feed(e.text, evs);
      parsed(evs, out);
    } else {
      out.push_back({OutputDelta::Kind::kContent, -1, e.text});
    }
  }
  if (e.finish == FinishReason::None) return;
  if (parser_) {
    parser_->finish(evs);
    parsed(evs, out);
  }
  finished_ = true;
  sum_.prompt_tokens = e.prompt_tokens;
  sum_.cached_tokens = e.cached_tokens;
  sum_.completion_tokens = e.generated_tokens;
  if (!plan_.chat || plan_.mode != ThinkingMode::kThinking) sum_.reasoning_tokens = 0;
  switch (e.finish) {
    case FinishReason::Stop: sum_.finish_reason = sum_.tool_calls > 0 ? "tool_calls" : "stop"; break;
    case FinishReason::Length: sum_.finish_reason = "length"; break;
    case FinishReason::Cancelled: sum_.finish_reason = "abort"; break;
    default:
      sum_.finish_reason = "error";
      sum_.error = e.error.empty() ? "the engine failed this request" : e.error;
  }
  timings_.e2e = std::chrono::duration<double>(now - t0_).count();
  timings_.prompt_tokens = sum_.prompt_tokens;
  timings_.generation_tokens = sum_.completion_tokens;
  timings_.finish_reason = sum_.finish_reason;
  if (metrics_) metrics_->on_request_finished(timings_);
}

}  // namespace dsv4
