// Prefix cache bookkeeping: longest block-aligned hit, token verification, LRU under the budget.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "runtime/prefix_cache.h"

namespace dsv4 {
namespace {

struct Fixture {
  Model model{load_weights(std::string(DSV4_SOURCE_DIR) + "/models/tiny")};
  CpuBackend be{model};
  // Snapshot of a fresh sequence fed `tokens`.
  std::unique_ptr<BackendSnapshot> snap(const std::vector<int32_t>& tokens) {
    auto s = be.new_sequence(0);
    BackendChunk c{s.get(), tokens, false};
    be.forward(std::span<const BackendChunk>(&c, 1));
    return be.snapshot(*s);
  }
};

std::vector<int32_t> seq(int32_t from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

TEST(PrefixCache, LongestVerifiedHitAndLruEviction) {
  Fixture f;
  KvBudget budget(state_costs(f.model.config()), size_t{64} << 20, 4);
  PrefixCache cache(budget, 4);
  const std::vector<int32_t> a = seq(10, 12);
  ASSERT_TRUE(cache.insert(std::span(a).first(4), f.snap(std::vector<int32_t>(a.begin(), a.begin() + 4))));
  ASSERT_TRUE(cache.insert(std::span(a).first(8), f.snap(std::vector<int32_t>(a.begin(), a.begin() + 8))));
  EXPECT_FALSE(cache.insert(std::span(a).first(8), f.snap(std::vector<int32_t>(a.begin(), a.begin() + 8))));
  EXPECT_THROW(cache.insert(std::span(a).first(6), f.snap(std::vector<int32_t>(a.begin(), a.begin() + 6))), Error);
  EXPECT_EQ(budget.used(), budget.bytes_for(4) + budget.bytes_for(8));
  EXPECT_EQ(cache.bytes(), budget.used());

  EXPECT_EQ(cache.lookup(a, 12).tokens, 8);
  EXPECT_EQ(cache.lookup(a, 7).tokens, 4);  // capped by max_len
  std::vector<int32_t> b = a;
  b[5] = 999;  // diverges inside the second block
  EXPECT_EQ(cache.lookup(b, 12).tokens, 4);
  b[0] = 999;
  EXPECT_EQ(cache.lookup(b, 12).tokens, 0);
  EXPECT_EQ(cache.lookup(b, 12).snapshot, nullptr);

  // lookup(a, 7) touched the 4-prefix last... then lookup(b) touched it again: 8 is the LRU.
  const BackendSnapshot* four = cache.lookup(a, 7).snapshot;
  EXPECT_TRUE(cache.evict_one(four) && cache.entries() == 1);
  EXPECT_EQ(cache.lookup(a, 12).tokens, 4);
  EXPECT_FALSE(cache.evict_one(four));  // the only entry is protected
  cache.clear();
  EXPECT_EQ(budget.used(), 0u);
}

TEST(PrefixCache, InsertEvictsOlderEntriesToFitTheBudget) {
  Fixture f;
  const StateCosts c = state_costs(f.model.config());
  KvBudget probe(c, size_t{64} << 20, 4);
  KvBudget budget(c, 2 * probe.bytes_for(8) + 100, 4);  // room for two snapshots
  PrefixCache cache(budget, 8);
  for (int32_t k = 0; k < 3; ++k) {
    const std::vector<int32_t> p = seq(20 * k + 2, 8);
    ASSERT_TRUE(cache.insert(p, f.snap(p)));
  }
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(cache.lookup(seq(2, 9), 9).tokens, 0);  // the oldest went
  EXPECT_EQ(cache.lookup(seq(22, 9), 9).tokens, 8);
  EXPECT_EQ(cache.lookup(seq(42, 9), 9).tokens, 8);
  KvBudget::Reservation r;  // a running sequence takes memory: the cache must give way
  while (!budget.reserve(r, 8)) ASSERT_TRUE(cache.evict_one());
  EXPECT_EQ(cache.entries(), 1u);
  budget.release(r);
}

}  // namespace
}  // namespace dsv4
