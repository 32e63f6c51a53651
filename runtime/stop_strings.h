// Stop strings on streamed text: text arrives in deltas (one per token, from the server's
// incremental detokenizer); a stop string may span deltas. Text that could still be the start
// of a stop string is held back, so what has been emitted never contains (a prefix of) a stop
// string that later completes. On a match, output ends right before the stop string (or right
// after it with include_stop).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace dsv4 {

class StopStringMatcher {
 public:
  StopStringMatcher(std::vector<std::string> stops, bool include_stop);

  struct Result {
    std::string emit;   // text safe to send now
    int stopped = -1;   // index of the matched stop string, or -1
  };
  // Feeds one delta. After a match, further calls are an error.
  Result push(std::string_view delta);
  // The held-back text, at the end of generation for another reason.
  std::string flush();
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  bool include_;
  bool done_ = false;
  std::string held_;
};

}  // namespace dsv4
