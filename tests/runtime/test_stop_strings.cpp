// Stop strings over streamed text deltas.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/stop_strings.h"

namespace dsv4 {
namespace {

// Feeds deltas; returns the emitted text and the matched index.
std::pair<std::string, int> run(StopStringMatcher m, const std::vector<std::string>& deltas) {
  std::string out;
  for (const auto& d : deltas) {
    auto r = m.push(d);
    out += r.emit;
    if (r.stopped >= 0) return {out, r.stopped};
  }
  return {out + m.flush(), -1};
}

TEST(StopStrings, SpanningTokensIsExcludedFromOutput) {
  EXPECT_EQ(run(StopStringMatcher({"STOP"}, false), {"hello S", "T", "OP world"}), std::make_pair(std::string("hello "), 0));
  EXPECT_EQ(run(StopStringMatcher({"STOP"}, true), {"hello S", "T", "OP world"}),
            std::make_pair(std::string("hello STOP"), 0));
  // A partial match that fails is released, nothing lost.
  EXPECT_EQ(run(StopStringMatcher({"STOP"}, false), {"a S", "T", "x", "S"}), std::make_pair(std::string("a STxS"), -1));
  // Earliest match wins across several strings.
  EXPECT_EQ(run(StopStringMatcher({"world", "lo w"}, false), {"hel", "lo world"}), std::make_pair(std::string("hel"), 1));
  // Overlapping prefixes: "aab" inside "aaab".
  EXPECT_EQ(run(StopStringMatcher({"aab"}, false), {"a", "a", "a", "b"}), std::make_pair(std::string("a"), 0));
  // Multi-byte text split by characters.
  EXPECT_EQ(run(StopStringMatcher({"\xe4\xbd\xa0\xe5\xa5\xbd"}, false), {"x\xe4\xbd\xa0", "\xe5\xa5\xbd", "y"}),
            std::make_pair(std::string("x"), 0));
}

TEST(StopStrings, HoldsBackOnlyPossiblePrefixes) {
  StopStringMatcher m({"</end>"}, false);
  EXPECT_EQ(m.push("abc<").emit, "abc");
  EXPECT_EQ(m.push("/e").emit, "");
  EXPECT_EQ(m.push("x").emit, "</ex");
  EXPECT_EQ(m.push("<").emit, "");
  EXPECT_EQ(m.flush(), "<");
  EXPECT_THROW(StopStringMatcher({""}, false), Error);
  StopStringMatcher done({"a"}, false);
  EXPECT_EQ(done.push("a").stopped, 0);
  EXPECT_THROW(done.push("b"), Error);
}

}  // namespace
}  // namespace dsv4
