#include "server/response_builder.h"

#include <chrono>
#include <random>

#include "server/api_error.h"
#include "server/sse.h"

namespace dsv4 {

std::string random_hex(int digits) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < digits; ++i) s += hex[rng() & 15];
  return s;
}

std::string make_tool_call_id() { return "call_" + random_hex(24); }

ResponseBuilder::ResponseBuilder(bool chat, std::string model, bool logprobs)
    : chat_(chat),
      logprobs_(logprobs),
      model_(std::move(model)),
      id_((chat ? "chatcmpl-" : "cmpl-") + random_hex(32)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

const std::string& ResponseBuilder::call_id(int index) {
  while (call_ids_.size() <= static_cast<size_t>(index)) call_ids_.push_back(make_tool_call_id());
  return call_ids_[static_cast<size_t>(index)];
}

ojson ResponseBuilder::chunk(ojson choice) const {
  ojson c;
  c["id"] = id_;
  c["object"] = chat_ ? "chat.completion.chunk" : "text_completion";
  c["created"] = created_;
  c["model"] = model_;
  c["choices"] = ojson::array({std::move(choice)});
  return c;
}

ojson ResponseBuilder::logprobs_json(const std::vector<LogprobEntry>& lp) {
  if (!logprobs_) return nullptr;
  return chat_ ? chat_logprobs(lp) : completion_logprobs(lp, text_offset_);
}

std::string ResponseBuilder::stream_open() const {
  if (!chat_) return "";
  return sse_event(chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                          {"finish_reason", nullptr}}));
}

std::string ResponseBuilder::stream_deltas(const std::vector<OutputDelta>& d, const std::vector<LogprobEntry>& lp) {
  std::vector<ojson> choices;
  for (size_t i = 0; i < d.size();) {
    // Adjacent text deltas of one kind (or fragments of one call) go out as one chunk.
    size_t j = i + 1;
    std::string text = d[i].text;
    const bool mergeable = d[i].kind != OutputDelta::Kind::kToolBegin;
    while (mergeable && j < d.size() && d[j].kind == d[i].kind && d[j].index == d[i].index) text += d[j++].text;
    if (!chat_) {
      choices.push_back({{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
      i = j;
      continue;
    }
    ojson delta;
    switch (d[i].kind) {
      case OutputDelta::Kind::kReasoning: delta["reasoning_content"] = text; break;
      case OutputDelta::Kind::kContent: delta["content"] = text; break;
      case OutputDelta::Kind::kToolBegin:
        delta["tool_calls"] = ojson::array({{{"index", d[i].index},
                                             {"id", call_id(d[i].index)},
                                             {"type", "function"},
                                             {"function", {{"name", text}, {"arguments", ""}}}}});
        break;
      case OutputDelta::Kind::kToolArgs:
        delta["tool_calls"] = ojson::array({{{"index", d[i].index}, {"function", {{"arguments", text}}}}});
        break;
    }
    choices.push_back({{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
    i = j;
  }
  if (logprobs_ && !lp.empty()) {
    if (choices.empty())
      choices.push_back(chat_ ? ojson{{"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", nullptr}}
                              : ojson{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
    choices.back()["logprobs"] = logprobs_json(lp);
  }
  std::string out;
  for (ojson& c : choices) out += sse_event(chunk(std::move(c)));
  return out;
}

std::string ResponseBuilder::stream_close(const GenerationSummary& s, bool include_usage) const {
  std::string out;
  if (s.finish_reason == "error") {
    out += sse_event(error_body(500, s.error, "", "", "server_error"));
  } else {
    ojson fin = chat_ ? ojson{{"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr},
                              {"finish_reason", s.finish_reason}}
                      : ojson{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", s.finish_reason}};
    out += sse_event(chunk(fin));
    if (include_usage) {
      ojson u = chunk(ojson::object());
      u["choices"] = ojson::array();
      u["usage"] = usage(s);
      out += sse_event(u);
    }
  }
  return out + sse_done();
}

void ResponseBuilder::add(const std::vector<OutputDelta>& d, const std::vector<LogprobEntry>& lp) {
  lp_.insert(lp_.end(), lp.begin(), lp.end());
  for (const auto& x : d) {
    switch (x.kind) {
      case OutputDelta::Kind::kReasoning: reasoning_ += x.text; break;
      case OutputDelta::Kind::kContent: content_ += x.text; break;
      case OutputDelta::Kind::kToolBegin:
        if (calls_.size() <= static_cast<size_t>(x.index)) calls_.resize(static_cast<size_t>(x.index) + 1);
        calls_[static_cast<size_t>(x.index)].first = x.text;
        break;
      case OutputDelta::Kind::kToolArgs:
        if (calls_.size() <= static_cast<size_t>(x.index)) calls_.resize(static_cast<size_t>(x.index) + 1);
        calls_[static_cast<size_t>(x.index)].second += x.text;
        break;
    }
  }
}

ojson ResponseBuilder::usage(const GenerationSummary& s) {
  ojson u;
  u["prompt_tokens"] = s.prompt_tokens;
  u["completion_tokens"] = s.completion_tokens;
  u["total_tokens"] = s.prompt_tokens + s.completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", s.cached_tokens}};
  u["completion_tokens_details"] = {{"reasoning_tokens", s.reasoning_tokens}};
  u["prompt_cache_hit_tokens"] = s.cached_tokens;  // DeepSeek's pair
  u["prompt_cache_miss_tokens"] = s.prompt_tokens - s.cached_tokens;
  return u;
}

ojson ResponseBuilder::final_response(const GenerationSummary& s) const {
  ojson r;
  r["id"] = id_;
  r["object"] = chat_ ? "chat.completion" : "text_completion";
  r["created"] = created_;
  r["model"] = model_;
  ojson choice;
  choice["index"] = 0;
  if (chat_) {
    ojson msg;
    msg["role"] = "assistant";
    msg["content"] = content_.empty() && !calls_.empty() ? ojson(nullptr) : ojson(content_);
    msg["reasoning_content"] = reasoning_.empty() ? ojson(nullptr) : ojson(reasoning_);
    if (!calls_.empty()) {
      ojson calls = ojson::array();
      for (size_t i = 0; i < calls_.size(); ++i)
        calls.push_back({{"id", i < call_ids_.size() ? call_ids_[i] : make_tool_call_id()},
                         {"type", "function"},
                         {"function", {{"name", calls_[i].first}, {"arguments", calls_[i].second}}}});
      msg["tool_calls"] = calls;
    }
    choice["message"] = msg;
  } else {
    choice["text"] = content_;
  }
  int64_t offset = 0;
  choice["logprobs"] = !logprobs_ ? ojson(nullptr) : chat_ ? chat_logprobs(lp_) : completion_logprobs(lp_, offset);
  choice["finish_reason"] = s.finish_reason;
  r["choices"] = ojson::array({choice});
  r["usage"] = usage(s);
  r["system_fingerprint"] = nullptr;
  return r;
}

}  // namespace dsv4
