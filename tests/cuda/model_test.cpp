// The device-resident CUDA model on the tiny goldens: the exact (fp32) path against the
// transformers oracle within the CPU engine's tolerance; the fast (FP8/FP4 tensor-core) path
// against the exact path by top-1 agreement and KL, teacher-forced over every position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "../model/golden_case.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "gpu_test.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/random_device_weights.h"
#include "model/model.h"

namespace dsv4::test {
namespace {

constexpr float kOracleTol = 1e-3f;
constexpr float kWellConditionedScale = 0.03f;

std::vector<float> run_chunks(CudaModel& m, const std::vector<int32_t>& ids, size_t n, size_t chunk) {
  DeviceSequence seq = m.new_sequence(static_cast<int64_t>(n) + 8);
  std::vector<float> all;
  for (size_t i = 0; i < n; i += chunk) {
    DeviceChunk c{&seq, std::span<const int32_t>(ids.data() + i, std::min(chunk, n - i))};
    std::vector<float> l = m.forward(std::span<const DeviceChunk>(&c, 1), true);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

class CudaGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DSV4_REQUIRE_GPU(); }
  const GoldenCase& c() { return golden_case(GetParam()); }
};

TEST_P(CudaGolden, ExactPrefillAndChunksMatchOracle) {
  CudaModel m(load_weights(c().dequant_dir), cuda::Precision::Exact);
  m.set_poison(true);
  const size_t L = c().ids.size(), V = static_cast<size_t>(c().cfg.vocab_size);
  for (size_t chunk : {L, size_t{1}, size_t{5}, size_t{16}}) {
    std::vector<float> got = run_chunks(m, c().ids, L, chunk);
    ASSERT_EQ(got.size(), L * V);
    const float diff = max_abs_diff(got.data(), c().logits.data(), L * V);
    std::printf("  %s chunk %zu: max |cuda exact - oracle| = %.3g\n", GetParam().c_str(), chunk, diff);
    EXPECT_LE(diff, kOracleTol) << "chunk " << chunk;
  }
}

TEST_P(CudaGolden, ExactDecodeMatchesOracleCacheRun) {
  CudaModel m(load_weights(c().quant_dir), cuda::Precision::Exact);
  m.set_poison(true);
  const size_t V = static_cast<size_t>(c().cfg.vocab_size), P = static_cast<size_t>(c().prefill);
  DeviceSequence seq = m.new_sequence(static_cast<int64_t>(c().ids.size()));
  DeviceChunk pre{&seq, std::span<const int32_t>(c().ids.data(), P)};
  std::vector<float> last = m.forward(std::span<const DeviceChunk>(&pre, 1), false);
  ASSERT_LE(max_abs_diff(last.data(), c().decode_logits.data(), V), kOracleTol);
  for (size_t t = P; t < c().ids.size(); ++t) {
    DeviceChunk step{&seq, std::span<const int32_t>(c().ids.data() + t, 1)};
    last = m.forward(std::span<const DeviceChunk>(&step, 1), false);
    ASSERT_LE(max_abs_diff(last.data(), c().decode_logits.data() + (t - P + 1) * V, V), kOracleTol) << "step " << t;
  }
}

TEST_P(CudaGolden, ExactBatchedSequencesMatchOracle) {
  CudaModel m(load_weights(c().quant_dir), cuda::Precision::Exact);
  m.set_poison(true);
  const size_t V = static_cast<size_t>(c().cfg.vocab_size);
  const std::vector<size_t> starts = {0, 5, 11};
  std::vector<DeviceSequence> seqs;
  for (size_t s = 0; s < 3; ++s) seqs.push_back(m.new_sequence(static_cast<int64_t>(c().ids.size())));
  for (size_t s = 0; s < 3; ++s) {
    DeviceChunk c0{&seqs[s], std::span<const int32_t>(c().ids.data(), starts[s] + 1)};
    m.forward(std::span<const DeviceChunk>(&c0, 1), false);
  }
  for (size_t step = 0; step < 12; ++step) {
    std::vector<DeviceChunk> chunks;
    for (size_t s = 0; s < 3; ++s)
      chunks.push_back({&seqs[s], std::span<const int32_t>(c().ids.data() + starts[s] + 1 + step * (s + 1), s + 1)});
    std::vector<float> got = m.forward(chunks, true);
    size_t row = 0;
    for (size_t s = 0; s < 3; ++s)
      for (size_t k = 0; k <= s; ++k, ++row) {
        const size_t p = starts[s] + 1 + step * (s + 1) + k;
        ASSERT_LE(max_abs_diff(got.data() + row * V, c().logits.data() + p * V, V), kOracleTol) << "seq " << s;
      }
  }
}

// The streams before hc_head (the MTP module's input) match the CPU model's on every row, and
// do not depend on which rows get logits.
TEST_P(CudaGolden, HiddenStreamsMatchCpuModel) {
  ModelWeights w = load_weights(c().quant_dir);
  CudaModel m(w, cuda::Precision::Exact);
  m.set_poison(true);
  Model cpu(std::move(w));
  const size_t L = c().ids.size();
  std::vector<float> want, got_all, got_last;
  SequenceState st = cpu.new_sequence();
  SequenceChunk sc{&st, std::span<const int32_t>(c().ids.data(), L)};
  cpu.forward(std::span<const SequenceChunk>(&sc, 1), true, &want);
  for (bool all : {true, false}) {
    DeviceSequence seq = m.new_sequence(static_cast<int64_t>(L));
    DeviceChunk dc{&seq, std::span<const int32_t>(c().ids.data(), L)};
    m.forward(std::span<const DeviceChunk>(&dc, 1), all, all ? &got_all : &got_last);
  }
  ASSERT_EQ(got_all.size(), want.size());
  ASSERT_EQ(got_all, got_last);
  const double err = rel_error(got_all, want);
  std::printf("  %s hidden streams: rel error cuda vs cpu %.3g\n", GetParam().c_str(), err);
  EXPECT_LE(err, 1e-4);
}

// KL(p || q) of softmaxes of two logit rows.
double kl(const float* p_logits, const float* q_logits, size_t V) {
  auto logsumexp = [V](const float* l) {
    double mx = l[0];
    for (size_t i = 1; i < V; ++i) mx = std::max(mx, double(l[i]));
    double s = 0;
    for (size_t i = 0; i < V; ++i) s += std::exp(l[i] - mx);
    return mx + std::log(s);
  };
  const double lp = logsumexp(p_logits), lq = logsumexp(q_logits);
  double k = 0;
  for (size_t i = 0; i < V; ++i) {
    const double a = p_logits[i] - lp, b = q_logits[i] - lq;
    k += std::exp(a) * (a - b);
  }
  return k;
}

struct Agreement {
  double top1 = 0, mean_kl = 0;
};

// Teacher-forced over every position of `ids`: exact and fast paths on the same checkpoint.
Agreement fast_vs_exact(const std::string& dir, const std::vector<int32_t>& ids, int64_t vocab) {
  ModelWeights w = load_weights(dir);
  CudaModel exact(w, cuda::Precision::Exact), fast(w, cuda::Precision::Fast);
  fast.set_poison(true);
  const size_t L = ids.size(), V = static_cast<size_t>(vocab);
  std::vector<float> a = run_chunks(exact, ids, L, L), b = run_chunks(fast, ids, L, L);
  size_t agree = 0;
  double kl_sum = 0;
  for (size_t t = 0; t < L; ++t) {
    const float* pa = a.data() + t * V;
    const float* pb = b.data() + t * V;
    agree += (std::max_element(pa, pa + V) - pa) == (std::max_element(pb, pb + V) - pb);
    kl_sum += kl(pa, pb, V);
  }
  return Agreement{double(agree) / L, kl_sum / L};
}

// A Fast model stores its indexer keys as bf16 (the scorer rounds them to bf16 anyway): the
// logits equal, bit for bit, those of the same model keeping fp32 keys (DSV4_INDEX_KEYS=f32),
// over a prefill and token-by-token decode past several window closes.
TEST_P(CudaGolden, FastBf16IndexKeysGiveBitwiseSameLogits) {
  const ModelWeights w = load_weights(c().quant_dir);
  ::setenv("DSV4_INDEX_KEYS", "f32", 1);
  CudaModel f32(w, cuda::Precision::Fast);
  ::unsetenv("DSV4_INDEX_KEYS");
  CudaModel bf16(w, cuda::Precision::Fast);
  ASSERT_EQ(f32.index_keys(), cuda::KeyFormat::F32);
  ASSERT_EQ(bf16.index_keys(), cuda::KeyFormat::BF16) << "golden " << GetParam() << ": the scorer should take "
                                                      << c().cfg.index_n_heads << " heads";
  EXPECT_EQ(CudaModel(w, cuda::Precision::Exact).index_keys(), cuda::KeyFormat::F32);
  const std::vector<int32_t>& ids = c().ids;
  ASSERT_GE(ids.size(), 4u * static_cast<size_t>(c().cfg.index_topk) + 8) << "too short to exercise the selection";
  for (const size_t chunk : {ids.size(), size_t(1)}) {
    f32.set_poison(true);
    bf16.set_poison(true);
    const std::vector<float> a = run_chunks(f32, ids, ids.size(), chunk), b = run_chunks(bf16, ids, ids.size(), chunk);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "chunk " << chunk;
  }
}

// `dsv4 bench --layers N` below the three hash-routed layers: the preset keeps N of them (all its
// layers hash-routed) and validates, instead of failing `num_hash_layers` 3 > N; the layer kinds
// are the full model's first N; past the preset's depth is an error. Host only.
TEST(CudaPreset, TruncatedPresetKeepsHashLayersItHas) {
  for (const char* name : {"v4-flash", "v4-pro"}) {
    const ModelConfig full = preset_config(name, 0);
    EXPECT_EQ(full.num_hash_layers, 3);
    for (int64_t L : {1, 2, 3, 4}) {
      const ModelConfig c = preset_config(name, L);
      EXPECT_EQ(c.num_layers, L) << name;
      EXPECT_EQ(c.num_hash_layers, std::min<int64_t>(3, L)) << name << " --layers " << L;
      ASSERT_EQ(c.layer_kinds.size(), static_cast<size_t>(L));
      for (int64_t i = 0; i < L; ++i) EXPECT_EQ(c.layer_kinds[i], full.layer_kinds[i]) << name << " layer " << i;
    }
    EXPECT_THROW(preset_config(name, full.num_layers + 1), Error) << name;
  }
}

// A Fast model at V4-Flash's attention shape (64 heads of 512: the tensor-core attention) stores
// its attention keys as bf16; the logits equal, bit for bit, those of the same model keeping
// fp32 keys (DSV4_KV=f32): a 600-token prefill (HCA and CSA windows close), decode steps, and
// two sequences at once. Random weights on the device, 4 layers (SWA, SWA, CSA, HCA). On the
// warpgroup-MMA kernel, q's norm inside it and in its own pass give the same logits too.
TEST(CudaKvFormat, FastBf16KeysGiveBitwiseSameLogits) {
  DSV4_REQUIRE_GPU();
  const ModelConfig cfg = preset_config("v4-flash", 4);
  // Two weight copies: each model re-lays its experts in place for the tensor cores.
  const ModelWeights wa = random_device_weights(cfg, 11), wb = random_device_weights(cfg, 11);
  ::setenv("DSV4_KV", "f32", 1);
  CudaModel f32(wa, cuda::Precision::Fast);
  ::unsetenv("DSV4_KV");
  CudaModel bf16(wb, cuda::Precision::Fast);
  ASSERT_EQ(f32.kv_format(), cuda::KeyFormat::F32);
  ASSERT_EQ(bf16.kv_format(), cuda::KeyFormat::BF16);
  std::mt19937 g(5);
  std::vector<int32_t> ids(640);
  for (auto& t : ids) t = static_cast<int32_t>(g() % cfg.vocab_size);
  auto run = [&](CudaModel& m) {
    DeviceSequence s0 = m.new_sequence(700), s1 = m.new_sequence(700);
    std::vector<float> all;
    auto step = [&](std::vector<DeviceChunk> cs) {
      const std::vector<float> l = m.forward(cs, true);
      all.insert(all.end(), l.begin(), l.end());
    };
    step({{&s0, std::span<const int32_t>(ids.data(), 600)}});
    step({{&s1, std::span<const int32_t>(ids.data() + 8, 300)}});
    for (int i = 0; i < 6; ++i)  // decode, both sequences in one call
      step({{&s0, std::span<const int32_t>(ids.data() + 600 + i, 1)},
            {&s1, std::span<const int32_t>(ids.data() + 620 + i, 1)}});
    return all;
  };
  f32.set_poison(true);
  bf16.set_poison(true);
  cuda::set_attention_wgmma(false);  // bf16 keys on the mma.sync kernel: bit for bit
  const std::vector<float> a = run(f32), b = run(bf16);
  cuda::set_attention_wgmma(true);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // On the warpgroup-MMA kernel (sm_90a): the same products summed in another fp32 order. (Each
  // switch below drops the decode graphs, which were captured on the mma.sync kernel.) q's norm
  // + RoPE in their own pass and inside that kernel: the same logits bit for bit.
  bf16.set_q_norm_in_attention(false);
  const std::vector<float> w_own_pass = run(bf16);
  bf16.set_q_norm_in_attention(true);
  const std::vector<float> w = run(bf16);
  ASSERT_EQ(a.size(), w.size());
  EXPECT_EQ(std::memcmp(w.data(), w_own_pass.data(), w.size() * sizeof(float)), 0) << "q norm inside attention";
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(w[i] - a[i]) * (w[i] - a[i]);
    den += double(a[i]) * a[i];
  }
  const double rel = std::sqrt(num / den);
  size_t same = 0, n = a.size() / cfg.vocab_size;
  for (size_t r = 0; r < n; ++r) {
    const float* x = a.data() + r * cfg.vocab_size;
    const float* y = w.data() + r * cfg.vocab_size;
    same += std::max_element(x, x + cfg.vocab_size) - x == std::max_element(y, y + cfg.vocab_size) - y;
  }
  std::printf("  bf16 keys, wgmma attention vs fp32 keys: logits rel error %.2e, top-1 %zu / %zu\n", rel, same, n);
  // The random 4-layer model amplifies any change of rounding (the two kernels differ by ~1e-3 at
  // the op, CudaOpsAttention.Bf16KeysGiveBitwiseSameOutputs; H100 2026-12-06: logits 5.5e-2,
  // top-1 87%); a broken key layout or mask gives rel error ~1 and top-1 near 0. The kernel's
  // accuracy is the op tests' (FastBf16KeysMatchTheFormula: 1.6-2.1e-3 against the formula).
  EXPECT_LE(rel, 0.15);
  EXPECT_GE(same * 4, n * 3);
}

// On the oracle goldens the random models are chaotic (spec/model.md §10: HF bf16 vs HF fp32
// already agrees on only 86% of argmaxes), so FP8 activation rounding moves the argmax often.
// Reported, not asserted; the assertion is on well-conditioned twins below.
TEST_P(CudaGolden, FastPathOnChaoticGoldensIsReported) {
  const Agreement g = fast_vs_exact(c().quant_dir, c().ids, c().cfg.vocab_size);
  std::printf("  %s (chaotic golden model) fast vs exact: top-1 agreement %.4f, mean KL %.3g\n", GetParam().c_str(),
              g.top1, g.mean_kl);
  RecordProperty("top1", std::to_string(g.top1));
  RecordProperty("mean_kl", std::to_string(g.mean_kl));
  EXPECT_GT(g.top1, 0.5);  // a broken fast path (wrong scales, layouts) lands near 1/vocab
}

// The same configs with sub-layer output projections scaled down (residual-dominated blocks, as in
// trained models): the fast path must track the exact path statistically. Agreement is pooled
// over all three configs' positions (560), since 70 positions cannot resolve 99%. The scale was
// calibrated on the H200 (run of 2026-12-02: output_scale 0.3 / 0.1 / 0.03 gave pooled top-1
// 95% / 97.7% / 99.5%, KL ≤ 4e-3 / 1.8e-4 / 1e-5). Kernel-level correctness of the fast path is
// carried by the op parity tests (linear_test, moe_test); this checks the assembled model.
TEST(CudaFastPath, AgreesWithExactPathOnWellConditionedModels) {
  DSV4_REQUIRE_GPU();
  size_t positions = 0;
  double agree = 0, kl_sum = 0;
  for (const char* name : {"tiny-a", "tiny-b", "tiny-c"}) {
    const GoldenCase& gc = golden_case(name);
    const std::string dir = gc.quant_dir + "-well-conditioned";
    write_random_checkpoint(gc.cfg, dir, true, RandomCheckpointOptions{17, false, kWellConditionedScale});
    const Agreement g = fast_vs_exact(dir, gc.ids, gc.cfg.vocab_size);
    std::printf("  %s output_scale %.2f fast vs exact: top-1 agreement %.4f, mean KL %.3g over %zu positions\n", name,
                kWellConditionedScale, g.top1, g.mean_kl, gc.ids.size());
    positions += gc.ids.size();
    agree += g.top1 * gc.ids.size();
    kl_sum += g.mean_kl * gc.ids.size();
  }
  const double top1 = agree / positions, mean_kl = kl_sum / positions;
  std::printf("  pooled: top-1 agreement %.4f, mean KL %.3g over %zu positions\n", top1, mean_kl, positions);
  RecordProperty("top1", std::to_string(top1));
  RecordProperty("mean_kl", std::to_string(mean_kl));
  EXPECT_GE(top1, 0.99);
  EXPECT_LE(mean_kl, 1e-3);
}

// CUDA graphs, side-stream branches, the routed sum inside hc_post and the routing inside the
// experts' grouping change nothing: one decode schedule on three models over the same checkpoint
// — one launching eagerly on one stream with the routed experts' own combine kernel and the
// routing on its own, one eagerly with the layer's side branches
// (branches.h), one replaying captured graphs of those branches — gives bitwise-equal
// logits at every step (so identical greedy tokens), across window closes of the compressed
// layers, batch-size changes, and a prefill that grows the scratch buffers (stale graphs must
// be re-captured).
TEST_P(CudaGolden, GraphsGiveBitwiseIdenticalLogits) {
  const ModelWeights w = load_weights(c().quant_dir);
  const std::vector<int32_t>& ids = c().ids;
  const size_t V = static_cast<size_t>(c().cfg.vocab_size);
  for (cuda::Precision prec : {cuda::Precision::Exact, cuda::Precision::Fast}) {
    CudaModel eager(w, prec), branched(w, prec), graphed(w, prec);
    eager.set_graphs(false);
    eager.set_branches(false);
    eager.set_combine_in_hc_post(false);  // the reference: the routed sum by its own kernel,
    eager.set_route_in_group(false);      // and the routing by its own
    branched.set_graphs(false);
    branched.set_branches(true);
    graphed.set_graphs(true);
    graphed.set_branches(true);
    for (CudaModel* m : {&eager, &branched, &graphed}) m->set_poison(true);
    const int64_t cap = static_cast<int64_t>(ids.size()) + 64;
    std::vector<DeviceSequence> se, sb, sg;
    auto tokens_at = [&](int64_t p, size_t n) {
      std::vector<int32_t> t(n);
      for (size_t i = 0; i < n; ++i) t[i] = ids[(p + i) % ids.size()];
      return t;
    };
    // Runs one call (each listed sequence takes n tokens) on both models and compares.
    auto step = [&](const std::vector<size_t>& which, size_t n, const char* what) {
      std::vector<std::vector<int32_t>> toks;
      std::vector<DeviceChunk> ce, cb, cg;
      for (size_t i : which) toks.push_back(tokens_at(se[i].pos, n));
      for (size_t k = 0; k < which.size(); ++k) {
        ce.push_back({&se[which[k]], toks[k]});
        cb.push_back({&sb[which[k]], toks[k]});
        cg.push_back({&sg[which[k]], toks[k]});
      }
      const std::vector<float> a = eager.forward(ce, false), b = branched.forward(cb, false),
                               g = graphed.forward(cg, false);
      ASSERT_EQ(a.size(), which.size() * V);
      ASSERT_EQ(b.size(), a.size());
      ASSERT_EQ(g.size(), a.size());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << what << " (branches, eager) at pos " << se[which[0]].pos;
      ASSERT_EQ(std::memcmp(a.data(), g.data(), a.size() * sizeof(float)), 0)
          << what << " (branches, graphs) at pos " << se[which[0]].pos;
    };
    auto add_sequence = [&] {
      se.push_back(eager.new_sequence(cap));
      sb.push_back(branched.new_sequence(cap));
      sg.push_back(graphed.new_sequence(cap));
    };
    for (size_t i = 0; i < 3; ++i) {
      add_sequence();
      step({i}, 3 + i, "prefill");
    }
    for (int t = 0; t < 10; ++t) step({0, 1, 2}, 1, "decode batch 3");
    for (int t = 0; t < 5; ++t) step({0, 2}, 1, "decode batch 2");
    add_sequence();
    step({3}, 9, "prefill of a new sequence");
    for (int t = 0; t < 20; ++t) step({0, 1, 2, 3}, 1, "decode batch 4");
    for (int t = 0; t < 6; ++t) step({1, 3}, 2, "two-token chunks");
    const GraphCache::Stats& st = graphed.graph_stats();
    std::printf("  %s %s: %lld replays, %lld captures, %lld eager, %lld failed captures\n", GetParam().c_str(),
                prec == cuda::Precision::Exact ? "exact" : "fast", (long long)st.replays, (long long)st.captures,
                (long long)st.eager, (long long)st.failed_captures);
    EXPECT_GE(st.replays, 30);
    EXPECT_GE(st.captures, 3);  // batch 3, batch 2, batch 4 (after the growth), two-token chunks
    EXPECT_EQ(st.failed_captures, 0);
    EXPECT_EQ(eager.graph_stats().replays, 0);
    EXPECT_EQ(branched.graph_stats().replays, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, CudaGolden, ::testing::Values("tiny-a", "tiny-b", "tiny-c"),
                         [](const auto& info) { return std::string(1, info.param.back()); });

}  // namespace
}  // namespace dsv4::test
