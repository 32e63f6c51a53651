#include "runtime/stop_strings.h"

#include "core/error.h"

namespace dsv4 {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop)
    : stops_(std::move(stops)), include_(include_stop) {
  for (const auto& s : stops_) DSV4_CHECK(!s.empty(), "stop: empty stop string");
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view delta) {
  DSV4_CHECK(!done_, "StopStringMatcher: push after a stop string matched");
  held_.append(delta);
  Result r;
  // The earliest match wins (ties: the first listed).
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = held_.find(stops_[i]);
    if (at != std::string::npos && at < best) best = at, r.stopped = static_cast<int>(i);
  }
  if (r.stopped >= 0) {
    r.emit = held_.substr(0, best + (include_ ? stops_[r.stopped].size() : 0));
    held_.clear();
    done_ = true;
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > hold; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  r.emit = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string s;
  s.swap(held_);
  return s;
}

}  // namespace dsv4
