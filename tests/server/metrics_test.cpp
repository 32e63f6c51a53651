// /metrics exposition of the engine's speculative-decoding counters.
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace dsv4 {
namespace {

TEST(server_metrics, SpecDecodeCountersComeFromEngineStats) {
  Metrics m("tiny");
  EngineStats s;
  s.spec_draft_tokens = 42;
  s.spec_accepted_tokens = 17;
  const std::string text = m.render(s);
  EXPECT_NE(text.find("# TYPE dsv4:spec_decode_num_draft_tokens_total counter"), std::string::npos);
  EXPECT_NE(text.find("dsv4:spec_decode_num_draft_tokens_total{model_name=\"tiny\"} 42\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dsv4:spec_decode_num_accepted_tokens_total{model_name=\"tiny\"} 17\n"), std::string::npos);
}

}  // namespace
}  // namespace dsv4
