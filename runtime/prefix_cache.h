// Prefix cache: snapshots of whole sequence states at block-aligned prefix lengths, keyed by
// a hash of the token prefix and verified token by token, so a later request sharing the
// prefix restores the state and prefills only the rest (the logits are bitwise those of a
// full prefill: the model is chunk-invariant). Snapshots hold pages of the same KvBudget as
// running sequences and are evicted least-recently-used when that budget is needed.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/backend.h"
#include "runtime/kv_budget.h"

namespace dsv4 {

class PrefixCache {
 public:
  PrefixCache(KvBudget& budget, int64_t block);
  ~PrefixCache();
  int64_t block() const { return block_; }

  struct Hit {
    const BackendSnapshot* snapshot = nullptr;
    int64_t tokens = 0;  // prefix length restored
  };
  // Longest cached prefix of `tokens` no longer than max_len (marks it most recently used).
  Hit lookup(std::span<const int32_t> tokens, int64_t max_len);
  bool contains(std::span<const int32_t> prefix) const;
  // Caches a snapshot of exactly `prefix` (length a multiple of block). Evicts older entries to
  // make room; false (snapshot dropped) when it cannot fit or is already cached.
  bool insert(std::span<const int32_t> prefix, std::unique_ptr<BackendSnapshot> snap);
  // Drops the least recently used entry other than `keep`; false when there is none.
  bool evict_one(const BackendSnapshot* keep = nullptr);
  void clear();

  size_t entries() const { return lru_.size(); }
  size_t bytes() const;  // budget held by the cached snapshots

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    uint64_t hash;
    std::unique_ptr<BackendSnapshot> snap;
    KvBudget::Reservation resv;
  };
  using Lru = std::list<Entry>;  // front = most recently used
  static uint64_t hash_step(uint64_t h, int32_t token);
  Lru::iterator find(std::span<const int32_t> prefix, uint64_t hash) const;
  void erase(Lru::iterator it);

  KvBudget* budget_;
  int64_t block_;
  mutable Lru lru_;
  std::unordered_multimap<uint64_t, Lru::iterator> index_;
};

}  // namespace dsv4
