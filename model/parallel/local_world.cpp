#include "model/parallel/local_world.h"

#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "model/parallel/shard_weights.h"

namespace dsv4 {

LocalWorld::LocalWorld(const ModelWeights& full, ParallelLayout layout) : layout_(layout), cfg_(full.config) {
  check_shardable(cfg_, layout_);
  const int W = layout_.world();
  // One LocalGroup per TP block and per EP block; rank r joins block r / degree.
  std::vector<std::shared_ptr<LocalGroup>> tp_groups, ep_groups;
  for (int g = 0; g < W / layout_.tp; ++g) tp_groups.push_back(std::make_shared<LocalGroup>(layout_.tp));
  for (int g = 0; g < W / layout_.ep; ++g) ep_groups.push_back(std::make_shared<LocalGroup>(layout_.ep));
  groups_ = tp_groups;
  groups_.insert(groups_.end(), ep_groups.begin(), ep_groups.end());
  for (int r = 0; r < W; ++r) {
    RankContext par;
    par.spec = layout_.spec(r);
    if (layout_.tp > 1) {
      comms_.push_back(std::make_unique<LocalCommunicator>(tp_groups[layout_.tp_group(r)], par.spec.tp_rank));
      par.tp = comms_.back().get();
    }
    if (layout_.ep > 1) {
      comms_.push_back(std::make_unique<LocalCommunicator>(ep_groups[layout_.ep_group(r)], par.spec.ep_rank));
      par.ep = comms_.back().get();
    }
    models_.push_back(std::make_unique<Model>(shard_weights(full, par.spec), par));
  }
}

size_t LocalWorld::Sequence::bytes() const {
  size_t b = 0;
  for (const auto& s : ranks) b += s.bytes();
  return b;
}

LocalWorld::Sequence LocalWorld::new_sequence() const {
  Sequence s;
  for (const auto& m : models_) s.ranks.push_back(m->new_sequence());
  return s;
}

std::vector<float> LocalWorld::forward(std::span<const Chunk> chunks, bool all_logits) {
  const int W = world();
  for (const auto& c : chunks) DSV4_CHECK(c.seq && c.seq->ranks.size() == static_cast<size_t>(W), "LocalWorld: sequence of another world");
  std::vector<std::vector<float>> logits(W);
  std::vector<std::exception_ptr> errors(W);
  auto run_rank = [&](int r) {
    try {
      std::vector<SequenceChunk> mc;
      for (const auto& c : chunks) mc.push_back({&c.seq->ranks[r], c.tokens, c.every_row});
      logits[r] = models_[r]->forward(mc, all_logits);
    } catch (...) {
      errors[r] = std::current_exception();
      for (auto& g : groups_) g->abort();  // the others would wait for this rank forever
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < W; ++r) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (auto& t : threads) t.join();

  // Report the failure that started it, not the aborts it caused.
  std::exception_ptr first;
  for (int r = 0; r < W; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      if (!first || std::string(e.what()).rfind("collective aborted", 0) != 0) first = errors[r];
      if (std::string(e.what()).rfind("collective aborted", 0) != 0) break;
    }
  }
  if (first) {
    for (auto& g : groups_) g->reset();
    std::rethrow_exception(first);
  }
  for (int r = 1; r < W; ++r)
    DSV4_CHECK(logits[r].size() == logits[0].size() &&
                   std::memcmp(logits[r].data(), logits[0].data(), logits[0].size() * sizeof(float)) == 0,
               "LocalWorld: rank ", r, " computed other logits than rank 0 (replicated state diverged)");
  return std::move(logits[0]);
}

}  // namespace dsv4
