#include "server/logprobs_json.h"

#include <cmath>

namespace dsv4 {

namespace {

// JSON has no -inf (a token removed by truncation in processed mode); OpenAI sends -9999.
double finite(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

ojson chat_token(const TokenText& t) {
  return {{"token", t.token}, {"logprob", finite(t.logprob)}, {"bytes", bytes_of(t.token)}};
}

int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

ojson chat_logprobs(const std::vector<LogprobEntry>& entries) {
  ojson content = ojson::array();
  for (const LogprobEntry& e : entries) {
    ojson item = chat_token(e.chosen);
    ojson top = ojson::array();
    for (const TokenText& t : e.top) top.push_back(chat_token(t));
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return {{"content", std::move(content)}};
}

ojson completion_logprobs(const std::vector<LogprobEntry>& entries, int64_t& text_offset) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.chosen.token);
    lps.push_back(finite(e.chosen.logprob));
    ojson top = ojson::object();
    for (const TokenText& t : e.top)  // two ids can share a text: the likelier one stays
      if (!top.contains(t.token)) top[t.token] = finite(t.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += code_points(e.chosen.token);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace dsv4
