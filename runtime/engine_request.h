// The engine's bookkeeping for one request while it is waiting or running: all its tokens
// (prompt, then generated), its backend sequence and budget pages, and the per-request
// sampling / stop-string state that survives preemption.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/backend.h"
#include "runtime/kv_budget.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/stop_strings.h"

namespace dsv4 {

struct EngineRequest {
  EngineRequest(uint64_t id_, Request r, int64_t vocab, int64_t max_tokens_, uint64_t seed_)
      : id(id_),
        req(std::move(r)),
        tokens(req.prompt),
        prompt_len(static_cast<int64_t>(req.prompt.size())),
        max_tokens(max_tokens_),
        seed(seed_),
        history(vocab, req.prompt),
        stop(req.stop.stop_strings, req.stop.include_stop_str_in_output) {}

  uint64_t id;
  Request req;
  std::vector<int32_t> tokens;  // prompt + generated; after preemption all are re-prefilled
  int64_t prompt_len;
  int64_t max_tokens;
  uint64_t seed;
  TokenHistory history;
  StopStringMatcher stop;

  std::unique_ptr<BackendSequence> seq;  // null while waiting
  KvBudget::Reservation resv;
  int64_t cached_tokens = 0;  // restored from the prefix cache at first admission
  int64_t preemptions = 0;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  int64_t computed() const { return seq ? seq->pos() : 0; }
  int64_t capacity() const { return prompt_len + max_tokens; }
};

}  // namespace dsv4
