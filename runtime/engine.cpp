#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/error.h"

namespace dsv4 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

namespace {

void emit(const EngineRequest& r, const TokenEvent& e) {
  if (!r.req.on_event) return;
  try {
    r.req.on_event(e);
  } catch (...) {  // a failing consumer must not take the engine down
  }
}

}  // namespace

Engine::Engine(ModelBackend& backend, EngineOptions opt)
    : backend_(&backend),
      opt_(opt),
      budget_(state_costs(backend.config(), opt.speculative_tokens), opt.kv_memory_bytes, opt.page_entries),
      cache_(opt.prefix_cache ? std::make_unique<PrefixCache>(budget_, opt.prefix_block) : nullptr),
      sched_(opt.limits, backend, budget_, cache_.get()) {
  // Like vLLM: one sequence of max_model_len must fit in the budget. Unset, it shrinks to fit.
  const int64_t fits = budget_.max_tokens_one_sequence();
  max_len_ = opt.max_model_len > 0 ? opt.max_model_len : std::min(backend.config().max_position_embeddings, fits);
  DSV4_CHECK(max_len_ > 1, "engine: max_model_len must be > 1, got ", max_len_);
  DSV4_CHECK(max_len_ <= fits, "engine: max_model_len ", max_len_, " needs ",
             format_bytes(static_cast<double>(budget_.bytes_for(max_len_))), " of state, more than the kv budget of ",
             format_bytes(static_cast<double>(budget_.budget())), " (holds ", fits,
             " tokens): raise --kv-memory or lower max_model_len");
  DSV4_CHECK(opt.speculative_tokens >= 0 && opt.speculative_tokens <= 16,
             "engine: speculative_tokens must be in [0, 16], got ", opt.speculative_tokens);
  DSV4_CHECK(opt.speculative_tokens == 0 || backend.has_mtp(),
             "engine: speculative decoding needs a backend with the MTP module (checkpoint with mtp.* tensors)");
  publish_stats();
}

Engine::~Engine() {
  stop();
  take_inbox();
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : live_) ids.push_back(id);
  for (uint64_t id : ids) finish(*live_.at(id), TokenEvent{}, FinishReason::Cancelled);
  if (cache_) cache_->clear();
}

uint64_t Engine::submit(Request r) {
  const ModelConfig& cfg = backend_->config();
  const int64_t V = cfg.vocab_size, P = static_cast<int64_t>(r.prompt.size());
  DSV4_CHECK(P > 0, "request: empty prompt");
  for (int32_t t : r.prompt) DSV4_CHECK(t >= 0 && t < V, "request: prompt token id ", t, " out of range [0, ", V, ")");
  DSV4_CHECK(P < max_len_, "request: prompt of ", P, " tokens leaves no room in the context of ", max_len_, " tokens");
  r.sampling.validate(V);
  StopConditions& s = r.stop;
  DSV4_CHECK(s.max_tokens == -1 || s.max_tokens > 0, "request: max_tokens must be positive, got ", s.max_tokens);
  const int64_t max_tokens = s.max_tokens == -1 ? max_len_ - P : s.max_tokens;
  DSV4_CHECK(P + max_tokens <= max_len_, "request: prompt (", P, " tokens) + max_tokens (", max_tokens,
             ") exceeds the context limit of ", max_len_, " tokens");
  for (int32_t t : s.stop_token_ids) DSV4_CHECK(t >= 0 && t < V, "request: stop token id ", t, " out of range");
  for (const auto& str : s.stop_strings) DSV4_CHECK(!str.empty(), "request: empty stop string");
  DSV4_CHECK(s.stop_strings.empty() || r.detokenize.push,
             "request: stop strings need a detokenizer hook (Request::detokenize)");
  const size_t need = budget_.bytes_for(P + max_tokens);
  DSV4_CHECK(need <= budget_.budget(), "request: prompt + max_tokens (", P + max_tokens, " tokens) needs ",
             format_bytes(static_cast<double>(need)), " of state, more than the whole kv budget of ",
             format_bytes(static_cast<double>(budget_.budget())));
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_id_++;
  const uint64_t seed = r.sampling.seed ? *r.sampling.seed : std::random_device{}() * 0x100000001ull + id;
  inbox_.push_back(std::make_unique<EngineRequest>(id, std::move(r), V, max_tokens, seed));
  cv_.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

void Engine::take_inbox() {
  std::vector<std::unique_ptr<EngineRequest>> in;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lk(mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& r : in) {
    sched_.enqueue(r.get());
    live_.emplace(r->id, std::move(r));
  }
  for (uint64_t id : cancels)
    if (auto it = live_.find(id); it != live_.end()) finish(*it->second, TokenEvent{}, FinishReason::Cancelled);
}

void Engine::finish(EngineRequest& r, TokenEvent ev, FinishReason why) {
  sched_.remove(&r);  // state and pages go back now
  ev.request_id = r.id;
  ev.finish = why;
  ev.prompt_tokens = r.prompt_len;
  ev.cached_tokens = r.cached_tokens;
  ev.generated_tokens = r.generated();
  emit(r, ev);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.finished;
  }
  const uint64_t id = r.id;
  live_.erase(id);  // r is gone after this
}

void Engine::on_token(EngineRequest& r, std::span<const float> logits) {
  if (r.req.on_logits) r.req.on_logits(logits);
  const uint64_t step = static_cast<uint64_t>(r.generated());
  emit_token(r, sample_next(logits, r.req.sampling, r.history, r.seed, step));
}

bool Engine::emit_token(EngineRequest& r, SampleResult s) {
  r.tokens.push_back(s.token);
  r.history.add_generated(s.token);

  TokenEvent ev;
  ev.request_id = r.id;
  ev.token = s.token;
  ev.logprob = s.logprob;
  ev.top_logprobs = std::move(s.top_logprobs);
  const StopConditions& sc = r.req.stop;
  const TextHook& detok = r.req.detokenize;
  const bool stop_token = (!sc.ignore_eos && s.token == backend_->config().eos_token_id) ||
                          std::find(sc.stop_token_ids.begin(), sc.stop_token_ids.end(), s.token) != sc.stop_token_ids.end();
  auto tail = [&] {  // what the detokenizer and the matcher still hold, at the end
    std::string t = detok.finish ? detok.finish() : std::string();
    if (r.stop.empty()) return t;
    StopStringMatcher::Result m = r.stop.push(t);
    return m.emit + r.stop.flush();
  };
  if (stop_token) {  // its own text is not part of the output
    ev.text = tail();
    ev.stop_token = s.token;
    finish(r, std::move(ev), FinishReason::Stop);
    return false;
  }
  if (detok.push) {
    std::string delta = detok.push(s.token);
    if (r.stop.empty()) {
      ev.text = std::move(delta);
    } else {
      StopStringMatcher::Result m = r.stop.push(delta);
      ev.text = std::move(m.emit);
      if (m.stopped >= 0) {
        ev.stop_string = sc.stop_strings[m.stopped];
        finish(r, std::move(ev), FinishReason::Stop);
        return false;
      }
    }
  }
  if (r.generated() >= r.max_tokens) {
    ev.text += tail();
    finish(r, std::move(ev), FinishReason::Length);
    return false;
  }
  emit(r, ev);
  return true;
}

bool Engine::step() {
  take_inbox();
  std::vector<ScheduledChunk> plan = sched_.schedule();
  if (plan.empty()) {
    publish_stats();
    return false;
  }
  std::vector<std::vector<int32_t>> verify(plan.size());
  std::vector<std::vector<std::vector<double>>> q(plan.size());
  if (opt_.speculative_tokens > 0) draft_round(plan, verify, q);
  std::vector<BackendChunk> chunks;
  std::vector<int64_t> pos0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    pos0.push_back(c.r->computed());
    if (!verify[i].empty()) {
      chunks.push_back({c.r->seq.get(), verify[i], true, true});
    } else {
      chunks.push_back({c.r->seq.get(), std::span<const int32_t>(c.r->tokens).subspan(c.r->computed(), c.n), c.want_logits});
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  try {
    logits = backend_->forward(chunks);
  } catch (const std::exception& e) {  // states of this batch are unusable: fail its requests
    for (const auto& c : plan) {
      TokenEvent ev;
      ev.error = e.what();
      finish(*c.r, std::move(ev), FinishReason::Error);
    }
    publish_stats();
    return true;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t prompt_rows = 0, sampled = 0;
  const size_t V = static_cast<size_t>(backend_->config().vocab_size);
  size_t k = 0;
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledChunk& c = plan[i];
    EngineRequest& r = *c.r;
    std::vector<int32_t> out;
    const float* rows = logits.data() + k * V;
    if (!verify[i].empty()) {  // decide, roll the rejected tokens back, then emit
      out = accept_round(r, verify[i], q[i], rows);
      backend_->accept(*r.seq, pos0[i] + static_cast<int64_t>(out.size()));
      drafted += static_cast<int64_t>(verify[i].size()) - 1;
      accepted += static_cast<int64_t>(out.size()) - 1;
      k += verify[i].size();
    }
    const int64_t pos = r.computed();
    prompt_rows += std::max<int64_t>(0, std::min(pos, r.prompt_len) - pos0[i]);
    if (cache_ && pos % cache_->block() == 0 && pos <= r.prompt_len) {
      std::span<const int32_t> prefix(r.tokens.data(), static_cast<size_t>(pos));
      if (!cache_->contains(prefix)) cache_->insert(prefix, backend_->snapshot(*r.seq));
    }
    if (!verify[i].empty()) {
      for (size_t j = 0; j < out.size(); ++j) {
        std::span<const float> row(rows + j * V, V);
        if (r.req.on_logits) r.req.on_logits(row);
        ++sampled;
        if (!emit_token(r, describe_token(row, r.req.sampling, r.history, out[j]))) break;
      }
    } else if (c.want_logits) {
      ++sampled;
      on_token(r, std::span<const float>(logits.data() + k++ * V, V));
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.steps;
    stats_.prompt_tokens += prompt_rows;
    stats_.generated_tokens += sampled;
    stats_.forward_seconds += secs;
    stats_.spec_draft_tokens += drafted;
    stats_.spec_accepted_tokens += accepted;
  }
  publish_stats();
  return true;
}

void Engine::publish_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.running = static_cast<int64_t>(sched_.running().size());
  stats_.waiting = static_cast<int64_t>(sched_.waiting().size() + inbox_.size());
  stats_.kv_budget = budget_.budget();
  stats_.kv_used = budget_.used();
  stats_.prefix_cache_bytes = cache_ ? cache_->bytes() : 0;
  stats_.prefix_cache_entries = cache_ ? static_cast<int64_t>(cache_->entries()) : 0;
  stats_.prefix_hit_tokens = sched_.prefix_hit_tokens();
  stats_.preemptions = sched_.preemptions();
}

std::string Engine::summary() const {
  return budget_.summary(max_len_) + "; max_model_len " + std::to_string(max_len_);
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void Engine::start() {
  DSV4_CHECK(!loop_.joinable(), "engine: already started");
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
  }
  loop_ = std::thread([this] {
    bool busy = false;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || busy || !inbox_.empty() || !cancels_.empty(); });
        if (stop_) return;
      }
      busy = step();
    }
  });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
}

void Engine::run_until_idle() {
  DSV4_CHECK(!loop_.joinable(), "engine: run_until_idle while the loop thread runs");
  while (step()) {
  }
}

}  // namespace dsv4
