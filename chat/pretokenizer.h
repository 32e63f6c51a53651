// Pre-tokenizer of a Hugging Face tokenizer.json: a Sequence of regex Splits (behavior
// Isolated or Removed) followed by ByteLevel(use_regex=false). serving.md §1.1.
// Each Split is applied to every piece produced by the previous one, with the regex seeing
// only that piece (so look-ahead such as `\s+(?!\S)` stops at the piece end), exactly as HF
// does. Regexes run on PCRE2 (JIT); HF matches with Oniguruma, so `\s`/`\S` are pinned to
// Oniguruma's Unicode White_Space set rather than left to PCRE2's version-dependent UCP rules.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv4 {

class Pretokenizer {
 public:
  // `j` is the "pre_tokenizer" value of tokenizer.json (may be null: no splitting).
  static Pretokenizer from_json(const nlohmann::json& j);
  // Steps given directly: each a regex with Isolated behaviour.
  static Pretokenizer from_regexes(const std::vector<std::string>& regexes);

  Pretokenizer();  // no steps: the whole text is one piece
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;
  ~Pretokenizer();

  // Appends the pieces of `text` (valid UTF-8) to `out`; empty pieces are never produced.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Step;
  static std::unique_ptr<Step> make_step(const std::string& pattern, bool literal, bool remove);
  void split_from(std::size_t level, std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<std::unique_ptr<Step>> steps_;
};

// Rewrites `\s` and `\S` (outside and, for `\s`, inside classes) to Oniguruma's Unicode
// White_Space set. Exposed for tests.
std::string onig_compatible_pattern(std::string_view pattern);

}  // namespace dsv4
