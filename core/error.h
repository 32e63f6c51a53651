// Errors: one exception type whose message names what was wrong (tensor, field, file).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... A>
std::string concat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
}  // namespace detail

template <typename... A>
[[noreturn]] void fail(const A&... a) {
  throw Error(detail::concat(a...));
}

}  // namespace dsv4

#define DSV4_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) ::dsv4::fail(__VA_ARGS__);    \
  } while (0)
