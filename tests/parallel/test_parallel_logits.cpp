// Simulated TP and EP worlds (threads in one process, LocalCommunicator) against the
// single-rank model on the same checkpoint: two sequences prefilled together in uneven
// chunks (every row's logits), then batched decode. TP sums the heads' and the shared
// expert's partial outputs over ranks, which reorders fp32 additions, so logits are compared
// with |Δ| ≤ 1e-4 + 1e-5·|ref|; EP alone keeps the single-rank order and must be bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "model/model.h"
#include "model/parallel/local_world.h"
#include "tests/parallel/test_models.h"

namespace dsv4 {
namespace {

std::vector<int32_t> tokens(int64_t n, int64_t vocab, int salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 37 + salt * 101 + i * i * 13) % vocab));
  return t;
}

// The schedule both sides run: calls of (sequence, tokens) chunks; returns all logits rows.
struct Call {
  std::vector<std::pair<int, std::vector<int32_t>>> chunks;
  bool all_logits;
};

std::vector<Call> schedule(int64_t V) {
  const std::vector<int32_t> a = tokens(30, V, 1), b = tokens(13, V, 2);
  std::vector<Call> s;
  s.push_back({{{0, {a.begin(), a.begin() + 19}}, {1, b}}, true});    // prefill A (part) + B
  s.push_back({{{0, {a.begin() + 19, a.end()}}}, true});               // A's second chunk alone
  for (int i = 0; i < 4; ++i) s.push_back({{{0, {a[i]}}, {1, {b[i]}}}, false});  // batched decode
  return s;
}

std::vector<float> run_single(Model& m, const std::vector<Call>& calls) {
  std::vector<SequenceState> st = {m.new_sequence(), m.new_sequence()};
  std::vector<float> all;
  for (const auto& c : calls) {
    std::vector<SequenceChunk> ch;
    for (const auto& [s, t] : c.chunks) ch.push_back({&st[s], t});
    std::vector<float> l = m.forward(ch, c.all_logits);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

std::vector<float> run_world(LocalWorld& w, const std::vector<Call>& calls) {
  std::vector<LocalWorld::Sequence> st = {w.new_sequence(), w.new_sequence()};
  std::vector<float> all;
  for (const auto& c : calls) {
    std::vector<LocalWorld::Chunk> ch;
    for (const auto& [s, t] : c.chunks) ch.push_back({&st[s], t});
    std::vector<float> l = w.forward(ch, c.all_logits);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

struct Diff {
  double max_abs = 0, max_rel = 0;
  bool within = true;
};

Diff compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Diff d;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    d.max_abs = std::max(d.max_abs, e);
    d.max_rel = std::max(d.max_rel, e / std::max(1e-30, std::fabs(static_cast<double>(ref[i]))));
    if (e > 1e-4 + 1e-5 * std::fabs(ref[i])) d.within = false;
  }
  return d;
}

void check_world(const std::string& model, bool quantized, ParallelLayout layout) {
  const ModelWeights& w = test::test_weights(model, quantized);
  static std::map<std::string, std::vector<float>> refs;  // single-rank logits per checkpoint
  const auto calls = schedule(w.config.vocab_size);
  const std::string key = model + (quantized ? "" : "-bf16");
  if (!refs.count(key)) {
    Model single(w);
    refs[key] = run_single(single, calls);
  }
  const std::vector<float>& ref = refs[key];
  LocalWorld world(w, layout);
  const std::vector<float> got = run_world(world, calls);
  ASSERT_EQ(got.size(), ref.size());
  const Diff d = compare(got, ref);
  std::printf("[parallel] %s%s tp=%d ep=%d (%d ranks): max |dlogit| %.3g, max rel %.3g over %zu logits\n",
              model.c_str(), quantized ? "" : " (bf16 twin)", layout.tp, layout.ep, layout.world(), d.max_abs,
              d.max_rel, ref.size());
  EXPECT_TRUE(d.within) << "max |d| " << d.max_abs;
  if (layout.tp == 1) {
    EXPECT_EQ(d.max_abs, 0.0) << "EP alone keeps the single-rank summation order";
  }
}

struct WorldCase {
  const char* model;
  bool quantized;
  int tp, ep;
};

void PrintTo(const WorldCase& c, std::ostream* os) {
  *os << c.model << (c.quantized ? "" : " (bf16)") << " tp " << c.tp << " ep " << c.ep;
}

class ParallelLogits : public ::testing::TestWithParam<WorldCase> {};

TEST_P(ParallelLogits, EqualSingleRank) {
  const WorldCase& c = GetParam();
  check_world(c.model, c.quantized, {c.tp, c.ep});
}

std::string case_name(const ::testing::TestParamInfo<WorldCase>& i) {
  std::string m = i.param.model;
  for (char& ch : m)
    if (ch == '-') ch = '_';
  return m + (i.param.quantized ? "" : "_bf16") + "_tp" + std::to_string(i.param.tp) + "_ep" + std::to_string(i.param.ep);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ParallelLogits,
    ::testing::Values(
        // tiny-tp: o_groups 4, shared width 512, 8 experts: every degree on the FP8/FP4 checkpoint.
        WorldCase{"tiny-tp", true, 2, 1}, WorldCase{"tiny-tp", true, 4, 1}, WorldCase{"tiny-tp", true, 1, 2},
        WorldCase{"tiny-tp", true, 1, 4}, WorldCase{"tiny-tp", true, 1, 8}, WorldCase{"tiny-tp", true, 2, 2},
        WorldCase{"tiny-tp", true, 2, 4}, WorldCase{"tiny-tp", true, 4, 2}, WorldCase{"tiny-tp", true, 4, 4},
        WorldCase{"tiny-tp", true, 2, 8},
        // The golden configs: EP on the quantised checkpoints, TP on the BF16 twins (their
        // 128-wide shared experts cannot be cut inside FP8 blocks; see ShardErrors).
        WorldCase{"tiny-a", true, 1, 2}, WorldCase{"tiny-a", true, 1, 4}, WorldCase{"tiny-a", true, 1, 8},
        WorldCase{"tiny-a", false, 2, 1}, WorldCase{"tiny-a", false, 2, 4}, WorldCase{"tiny-b", true, 1, 2},
        WorldCase{"tiny-b", true, 1, 4}, WorldCase{"tiny-b", false, 2, 2}, WorldCase{"tiny-c", true, 1, 2},
        WorldCase{"tiny-c", true, 1, 4}, WorldCase{"tiny-c", true, 1, 8}, WorldCase{"tiny-c", false, 3, 1}),
    case_name);

// Splits the model cannot take are Errors naming the flag and what is in the way.
void expect_error(const std::string& model, bool quantized, ParallelLayout l, const std::string& needle) {
  try {
    LocalWorld w(test::test_weights(model, quantized), l);
    ADD_FAILURE() << "no error for tp=" << l.tp << " ep=" << l.ep << " on " << model;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ShardErrors, ClearMessages) {
  expect_error("tiny-a", true, {2, 1}, "cuts its 128-wide quantisation blocks");  // shared expert 128 / 2
  expect_error("tiny-a", true, {4, 1}, "o_groups 2 is not divisible");
  expect_error("tiny-b", true, {1, 8}, "n_routed_experts 4 is not divisible");
  expect_error("tiny-c", true, {3, 1}, "cuts its 128-wide quantisation blocks");  // wo_a rows 96
  expect_error("tiny-tp", true, {3, 2}, "one must divide the other");
  expect_error("tiny-tp", true, {0, 1}, "--tp and --ep must be >= 1");
}

TEST(LocalWorld, BadInputIsAnErrorAndTheWorldRecovers) {
  LocalWorld w(test::test_weights("tiny-tp"), {2, 4});
  LocalWorld::Sequence s = w.new_sequence();
  const std::vector<int32_t> bad = {1, 2, 100000};
  LocalWorld::Chunk c{&s, bad};
  EXPECT_THROW(w.forward(std::span<const LocalWorld::Chunk>(&c, 1), false), Error);
  // The world is usable again afterwards.
  LocalWorld::Sequence s2 = w.new_sequence();
  const std::vector<int32_t> ok = {1, 2, 3};
  LocalWorld::Chunk c2{&s2, ok};
  EXPECT_EQ(w.forward(std::span<const LocalWorld::Chunk>(&c2, 1), false).size(), 256u);
}

}  // namespace
}  // namespace dsv4
