// KV/state accounting (runtime/kv_budget.h) against the real state the CPU engine holds.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/model.h"
#include "model/speculative.h"
#include "model/weights.h"
#include "runtime/kv_budget.h"

namespace dsv4 {
namespace {

const std::string kTiny = std::string(DSV4_SOURCE_DIR) + "/models/tiny";

TEST(StateCosts, TinyByHand) {
  // tiny: SWA, CSA m=4, HCA m=8, CSA m=4; window 8, head_dim 128, index_head_dim 128.
  StateCosts c = state_costs(load_config(kTiny + "/config.json"));
  EXPECT_EQ(c.window_bytes, 4u * 8 * 128 * 4);
  // CSA: 7 rows of a,z (2·128 wide) + indexer a,z (2·128 wide); HCA: 7 rows of a,z (128 wide).
  EXPECT_EQ(c.pending_max_bytes, 2u * 7 * (2 * 256 * 4 + 2 * 256 * 4) + 7u * 2 * 128 * 4);
  ASSERT_EQ(c.kinds.size(), 3u);
  EXPECT_EQ(c.kinds[0].name, "csa-entries/m4");
  EXPECT_EQ(c.kinds[0].entry_bytes, 2u * 128 * 4);
  EXPECT_EQ(c.kinds[1].name, "csa-indexer-keys/m4");
  EXPECT_EQ(c.kinds[1].entry_bytes, 2u * 128 * 4);
  EXPECT_EQ(c.kinds[2].name, "hca-entries/m8");
  EXPECT_EQ(c.kinds[2].ratio, 8);
  EXPECT_DOUBLE_EQ(c.bytes_per_token(), 1024.0 / 4 + 1024.0 / 4 + 512.0 / 8);
}

TEST(StateCosts, MatchesSequenceStateBytesOfRealRuns) {
  Model m(load_weights(kTiny));
  StateCosts c = state_costs(m.config());
  // Different chunkings reach the same positions with the same state size.
  for (int64_t chunk : {1, 3, 7, 16}) {
    SequenceState st = m.new_sequence();
    EXPECT_EQ(st.bytes(), c.bytes_at(0));
    size_t max_pending = 0;
    for (int64_t p = 0; p < 41;) {
      const int64_t n = std::min<int64_t>(chunk, 41 - p);
      std::vector<int32_t> toks(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) toks[i] = static_cast<int32_t>((p + i) * 37 % 500);
      SequenceChunk sc{&st, toks};
      m.forward(std::span<const SequenceChunk>(&sc, 1), false);
      p += n;
      ASSERT_EQ(st.bytes(), c.bytes_at(p)) << "chunk " << chunk << " pos " << p;
      size_t grow = c.window_bytes;
      for (const auto& k : c.kinds) grow += static_cast<size_t>(p / k.ratio) * k.entry_bytes;
      max_pending = std::max(max_pending, st.bytes() - grow);
    }
    if (chunk == 1) {
      EXPECT_EQ(max_pending, c.pending_max_bytes);  // the worst case is reached
    }
  }
}

// With speculation the fixed part adds the MTP ring and feed and what a verify holds until
// accept(); real speculative states (long prefill chunks, draft rounds, rollbacks) never hold
// more than the budget says.
TEST(StateCosts, SpeculativeStateStaysWithinItsBudget) {
  Model m(load_weights(kTiny));
  const ModelConfig& cfg = m.config();
  const StateCosts plain = state_costs(cfg), spec = state_costs(cfg, 3);
  const size_t hd = static_cast<size_t>(cfg.hc_mult * cfg.hidden_size), W = static_cast<size_t>(cfg.sliding_window);
  EXPECT_EQ(plain.mtp_bytes, 0u);
  EXPECT_EQ(spec.mtp_bytes, 4 * (W * static_cast<size_t>(cfg.head_dim) + W * (hd + 1) + hd));
  EXPECT_EQ(spec.fixed_bytes(), plain.fixed_bytes() + spec.mtp_bytes + spec.verify_bytes);
  EXPECT_GT(spec.verify_bytes, 0u);
  SpecModel sm(m, true);
  SpecState s = sm.new_state();
  std::vector<int32_t> prompt(5 * W);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + i * 29 % 400);
  SpecChunk pre{&s, prompt};
  sm.forward(std::span<const SpecChunk>(&pre, 1));  // one chunk of 5 windows
  EXPECT_EQ(s.feed.bytes(), 4 * W * (hd + 1)) << "a long chunk keeps only the last window of streams";
  int64_t pos = s.target.pos;
  int32_t tok = 17;
  for (int round = 0; round < 6; ++round) {
    std::vector<int32_t> verify = {tok};
    for (int k = 0; k < 3; ++k) {
      SpecState* ps = &s;
      const std::vector<float> l = sm.draft(std::span<SpecState* const>(&ps, 1), std::span<const int32_t>(&verify.back(), 1));
      verify.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
    }
    SpecChunk v{&s, verify, true};
    sm.forward(std::span<const SpecChunk>(&v, 1));
    EXPECT_LE(s.bytes(), spec.bytes_at(s.target.pos)) << "round " << round;
    sm.accept(s, pos + 1 + round % 3);  // keep 1..3 of the 4 verified tokens
    pos = s.target.pos;
    tok = verify[static_cast<size_t>(round % 3) + 1];
    EXPECT_LE(s.bytes(), spec.bytes_at(pos)) << "round " << round;
    EXPECT_EQ(s.target.bytes(), plain.bytes_at(pos)) << "round " << round << ": rollback left rows behind";
  }
}


TEST(KvBudget, PagesCoverTheStateAndReleaseAtOnce) {
  StateCosts c = state_costs(load_config(kTiny + "/config.json"));
  const int64_t E = 4;
  KvBudget b(c, 1 << 20, E);
  for (int64_t t = 1; t <= 200; ++t) {
    EXPECT_GE(b.bytes_for(t), c.bytes_at(t));
    size_t slack = c.pending_max_bytes;
    for (const auto& k : c.kinds) slack += static_cast<size_t>(E) * k.entry_bytes;
    EXPECT_LT(b.bytes_for(t) - c.bytes_at(t), slack);
  }
  // 16 tokens = 4 CSA entries (one page each kind) + 2 HCA entries (one page).
  EXPECT_EQ(b.bytes_for(16), c.fixed_bytes() + 4u * 1024 + 4u * 1024 + 4u * 512);
  EXPECT_EQ(b.bytes_for(17), b.bytes_for(16));
  EXPECT_EQ(b.bytes_for(33), c.fixed_bytes() + 2 * 4u * 1024 + 2 * 4u * 1024 + 4u * 512);

  KvBudget::Reservation r1, r2;
  ASSERT_TRUE(b.reserve(r1, 10));
  EXPECT_EQ(b.used(), b.bytes_for(10));
  ASSERT_TRUE(b.reserve(r1, 40));  // growth
  ASSERT_TRUE(b.reserve(r1, 20));  // never shrinks
  EXPECT_EQ(r1.tokens, 40);
  ASSERT_TRUE(b.reserve(r2, 5));
  EXPECT_EQ(b.used(), b.bytes_for(40) + b.bytes_for(5));
  b.release(r1);
  EXPECT_EQ(b.used(), b.bytes_for(5));
  EXPECT_FALSE(r1.active);
  b.release(r2);
  EXPECT_EQ(b.used(), 0u);
}

TEST(KvBudget, RefusesWhatDoesNotFitAndReports) {
  StateCosts c = state_costs(load_config(kTiny + "/config.json"));
  const size_t budget = 3 * c.fixed_bytes() + c.fixed_bytes() / 2;
  KvBudget b(c, budget, 16);
  std::vector<KvBudget::Reservation> rs(4);
  int admitted = 0;
  for (auto& r : rs) admitted += b.reserve(r, 1);
  EXPECT_EQ(admitted, 3);  // the fixed part of a 4th does not fit
  EXPECT_FALSE(rs[3].active);
  EXPECT_LE(b.used(), b.budget());
  const size_t before = b.used();
  EXPECT_FALSE(b.reserve(rs[0], 100000));  // far beyond the budget: unchanged
  EXPECT_EQ(b.used(), before);
  EXPECT_EQ(rs[0].tokens, 1);
  for (auto& r : rs) b.release(r);

  const int64_t one = b.max_tokens_one_sequence();
  EXPECT_LE(b.bytes_for(one), budget);
  EXPECT_GT(b.bytes_for(one + 1), budget);
  EXPECT_EQ(b.sequences_at(1024), static_cast<int64_t>(budget / b.bytes_for(1024)));
  const std::string s = b.summary(1024);
  EXPECT_NE(s.find("kv budget "), std::string::npos) << s;
  EXPECT_NE(s.find(std::to_string(one) + " tokens"), std::string::npos) << s;
  EXPECT_THROW(KvBudget(c, 1000, 16), Error);  // not even one sequence
}

TEST(MemorySize, ParsesUnitsAndRejectsJunk) {
  EXPECT_EQ(parse_memory_size("123456"), 123456u);
  EXPECT_EQ(parse_memory_size("64K"), 64u << 10);
  EXPECT_EQ(parse_memory_size("512MiB"), 512u << 20);
  EXPECT_EQ(parse_memory_size("1GiB"), size_t{1} << 30);
  EXPECT_EQ(parse_memory_size("1.5G"), size_t{3} << 29);
  EXPECT_EQ(parse_memory_size("2gb"), size_t{2} << 30);
  EXPECT_THROW(parse_memory_size("lots"), Error);
  EXPECT_THROW(parse_memory_size("1X"), Error);
  EXPECT_THROW(parse_memory_size("0"), Error);
  EXPECT_EQ(gpu_kv_budget(1000, 400, 0.9), 500u);
  EXPECT_THROW(gpu_kv_budget(1000, 950, 0.9), Error);
  EXPECT_THROW(gpu_kv_budget(1000, 0, 1.5), Error);
}

}  // namespace
}  // namespace dsv4
