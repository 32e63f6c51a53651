// A rank's weights are slices of the whole model's: each sliced matrix dequantises to exactly
// the corresponding block of the full matrix (FP8 128×128 scales, FP4 per-32 scales, dense),
// row slices are views into the same mmap, and a rank holds only its own experts.
#include <gtest/gtest.h>

#include "backend/cpu/linear.h"
#include "core/error.h"
#include "model/parallel/shard_weights.h"
#include "tests/parallel/test_models.h"

namespace dsv4 {
namespace {

// Block [r0, r0+nr) × [c0, c0+nc) of a dequantised [out, in] matrix.
std::vector<float> block(const WeightView& w, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  const std::vector<float> all = cpu::dequant_all(w);
  std::vector<float> b;
  for (int64_t r = r0; r < r0 + nr; ++r) b.insert(b.end(), all.begin() + r * w.in + c0, all.begin() + r * w.in + c0 + nc);
  return b;
}

TEST(ShardWeights, SlicesDequantiseToTheFullMatrixBlocks) {
  const ModelWeights& full = test::test_weights("tiny-tp");
  const ModelConfig& c = full.config;
  const int tp = 4, ep = 2;
  for (int r = 0; r < tp; ++r) {
    const ShardSpec sp = ParallelLayout{tp, ep}.spec(r);
    const ModelWeights w = shard_weights(full, sp);
    EXPECT_EQ(w.config.num_heads, c.num_heads / tp);
    EXPECT_EQ(w.config.o_groups, c.o_groups / tp);
    const int64_t D = c.head_dim, Ro = c.o_lora_rank, Hr = c.num_heads / tp, Gr = c.o_groups / tp;
    for (size_t li = 0; li < w.layers.size(); ++li) {
      const AttentionWeights& A = w.layers[li].attn;
      const AttentionWeights& F = full.layers[li].attn;
      ASSERT_EQ(A.wq_b.format, WeightFormat::FP8Block);
      EXPECT_EQ(A.wq_b.data, F.wq_b.data + r * Hr * D * F.wq_b.in) << "a row slice is a view into the mmap";
      EXPECT_EQ(cpu::dequant_all(A.wq_b), block(F.wq_b, r * Hr * D, Hr * D, 0, F.wq_b.in));
      EXPECT_EQ(cpu::dequant_all(A.wo_a), block(F.wo_a, r * Gr * Ro, Gr * Ro, 0, F.wo_a.in));
      EXPECT_EQ(cpu::dequant_all(A.wo_b), block(F.wo_b, 0, F.wo_b.out, r * Gr * Ro, Gr * Ro));
      EXPECT_EQ(A.sink, Vec(F.sink.begin() + r * Hr, F.sink.begin() + (r + 1) * Hr));
      const ExpertWeights& S = w.layers[li].ffn.shared;
      const ExpertWeights& FS = full.layers[li].ffn.shared;
      const int64_t Ir = FS.w1.out / tp;
      EXPECT_EQ(cpu::dequant_all(S.w1), block(FS.w1, r * Ir, Ir, 0, FS.w1.in));
      EXPECT_EQ(cpu::dequant_all(S.w3), block(FS.w3, r * Ir, Ir, 0, FS.w3.in));
      EXPECT_EQ(cpu::dequant_all(S.w2), block(FS.w2, 0, FS.w2.out, r * Ir, Ir));
      // Replicated parts are the same views.
      EXPECT_EQ(A.wkv.data, F.wkv.data);
      EXPECT_EQ(A.wq_a.data, F.wq_a.data);
      // Experts: only the rank's contiguous block.
      const int64_t Er = c.n_routed_experts / ep;
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const bool mine = e / Er == sp.ep_rank;
        EXPECT_EQ(!w.layers[li].ffn.experts[e].w1.empty(), mine) << "layer " << li << " expert " << e;
        if (mine) {
          EXPECT_EQ(w.layers[li].ffn.experts[e].w2.data, full.layers[li].ffn.experts[e].w2.data);
        }
      }
    }
  }
}

TEST(ShardWeights, Fp4ColumnAndRowSlices) {
  const WeightView& e = test::test_weights("tiny-tp").layers[1].ffn.experts[3].w2;  // [256, 512] FP4
  ASSERT_EQ(e.format, WeightFormat::FP4Group32);
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> store;
  EXPECT_EQ(cpu::dequant_all(slice_cols(e, 64, 96, "w2", store)), block(e, 0, e.out, 64, 96));
  EXPECT_EQ(cpu::dequant_all(slice_rows(e, 5, 17, "w2")), block(e, 5, 17, 0, e.in));
  EXPECT_THROW(slice_cols(e, 16, 32, "w2", store), Error);  // inside a 32-group
}

TEST(ShardWeights, DenseSlicesAnywhere) {
  const WeightView& w = test::test_weights("tiny-c", false).layers[0].attn.wo_b;  // BF16 [384, 288]
  ASSERT_EQ(w.format, WeightFormat::Dense);
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> store;
  EXPECT_EQ(cpu::dequant_all(slice_cols(w, 96, 96, "wo_b", store)), block(w, 0, w.out, 96, 96));
  EXPECT_EQ(cpu::dequant_all(slice_rows(w, 7, 50, "wo_b")), block(w, 7, 50, 0, w.in));
}

TEST(ShardWeights, Fp8CutsInsideBlocksAreErrors) {
  const WeightView& w = test::test_weights("tiny-tp").layers[0].attn.wo_b;  // FP8 [256, 512]
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> store;
  EXPECT_THROW(slice_rows(w, 64, 128, "wo_b"), Error);
  EXPECT_THROW(slice_cols(w, 0, 100, "wo_b", store), Error);
  EXPECT_EQ(cpu::dequant_all(slice_cols(w, 384, 128, "wo_b", store)), block(w, 0, w.out, 384, 128));
}

}  // namespace
}  // namespace dsv4
