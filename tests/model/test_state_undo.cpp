// Rollback after speculative verification (model/state_undo.h): truncating a verified chunk back
// to any position, then continuing, gives bitwise the logits of a run that never saw the
// rejected tokens, and the same state bytes (compressor rows included) — across window-ring
// wrap, closing HCA/CSA entries and indexer keys.
#include <gtest/gtest.h>

#include <cstring>

#include "golden_case.h"
#include "model/state_undo.h"

namespace dsv4::test {
namespace {

std::vector<float> run(Model& m, SequenceState& st, std::span<const int32_t> toks, bool all) {
  SequenceChunk c{&st, toks};
  return m.forward(std::span<const SequenceChunk>(&c, 1), all);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(StateUndo, TruncateThenContinueIsBitwiseTheUnspeculatedRun) {
  Model m(load_weights(source_dir() + "/models/tiny"));
  const StateLayout lay = target_layout(m.config());
  std::vector<int32_t> ids;
  for (int i = 0; i < 64; ++i) ids.push_back((i * 7919 + 13) % 10240);
  const std::vector<int32_t> junk = {5, 6, 7, 8, 9};
  // Prefix lengths around the window (8), CSA (4) and HCA (8) boundaries, every verify length,
  // every kept count.
  for (int64_t p : {3, 4, 7, 8, 12, 23}) {
    for (int64_t n = 1; n <= 5; ++n) {
      for (int64_t keep = 0; keep <= n; ++keep) {
        SequenceState st = m.new_sequence();
        run(m, st, std::span<const int32_t>(ids.data(), p), false);
        // The verify chunk: `keep` true tokens, then junk.
        std::vector<int32_t> chunk(ids.begin() + p, ids.begin() + p + keep);
        chunk.insert(chunk.end(), junk.begin(), junk.begin() + (n - keep));
        StateUndo u;
        undo_record(u, st, lay, n);
        run(m, st, chunk, true);
        undo_truncate(u, st, lay, p + keep);
        ASSERT_EQ(st.pos, p + keep);
        SequenceState ref = m.new_sequence();
        run(m, ref, std::span<const int32_t>(ids.data(), p + keep), false);
        // The compressor rows too: no pinned row outlives the round.
        for (size_t l = 0; l < st.layers.size(); ++l)
          for (auto [a, b] : {std::pair{&st.layers[l].cmp, &ref.layers[l].cmp}, {&st.layers[l].idx_cmp, &ref.layers[l].idx_cmp}}) {
            EXPECT_EQ(a->start, b->start) << "layer " << l << " p " << p << " n " << n << " keep " << keep;
            EXPECT_TRUE(same_bits(a->a, b->a) && same_bits(a->z, b->z)) << "layer " << l;
          }
        EXPECT_EQ(st.bytes(), ref.bytes());
        std::vector<float> got = run(m, st, std::span<const int32_t>(ids.data() + p + keep, 12), true);
        std::vector<float> want = run(m, ref, std::span<const int32_t>(ids.data() + p + keep, 12), true);
        ASSERT_TRUE(same_bits(got, want)) << "p " << p << " n " << n << " keep " << keep;
        for (size_t l = 0; l < st.layers.size(); ++l) {
          EXPECT_EQ(st.layers[l].entries, ref.layers[l].entries) << "layer " << l;
          EXPECT_EQ(st.layers[l].idx_keys, ref.layers[l].idx_keys) << "layer " << l;
          EXPECT_EQ(st.layers[l].window, ref.layers[l].window) << "layer " << l;
        }
      }
    }
  }
}

// Without the ring restore the rejected tokens leave traces (positions 10, 11 overwrite the
// slots of 2, 3, still in the window of 8): the check above can fail.
TEST(StateUndo, ControlWithoutRingRestoreDiffers) {
  Model m(load_weights(source_dir() + "/models/tiny"));
  const StateLayout lay = target_layout(m.config());
  std::vector<int32_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
  SequenceState st = m.new_sequence(), ref = m.new_sequence();
  run(m, st, std::span<const int32_t>(ids.data(), 10), false);
  StateUndo u;
  undo_record(u, st, lay, 0);  // pins compressors, saves no slot
  const std::vector<int32_t> junk = {100, 200};
  run(m, st, junk, false);
  undo_truncate(u, st, lay, 10);
  run(m, ref, std::span<const int32_t>(ids.data(), 10), false);
  std::vector<float> a = run(m, st, std::span<const int32_t>(ids.data() + 10, 6), true);
  std::vector<float> b = run(m, ref, std::span<const int32_t>(ids.data() + 10, 6), true);
  EXPECT_FALSE(same_bits(a, b));
}

}  // namespace
}  // namespace dsv4::test
