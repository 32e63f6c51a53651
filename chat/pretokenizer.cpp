#include "chat/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "chat/utf8.h"
#include "core/error.h"

namespace dsv4 {

namespace {

// Oniguruma's Unicode \s is the White_Space property: TAB..CR, NEL and the Z categories.
constexpr const char* kSpaceInner = "\\t-\\r\\x{85}\\p{Z}";

struct JitStack {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_match_data* md = nullptr;
  JitStack() {
    // Long whitespace or letter runs backtrack deeply; 4 MiB covers megabyte-long pieces.
    stack = pcre2_jit_stack_create(64 * 1024, 4 * 1024 * 1024, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
    md = pcre2_match_data_create(1, nullptr);
  }
  ~JitStack() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
};

JitStack& thread_jit() {
  thread_local JitStack js;  // match state is per thread so encode() stays thread-safe
  return js;
}

}  // namespace

std::string onig_compatible_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  std::size_t class_start = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kSpaceInner) : "[" + std::string(kSpaceInner) + "]";
      } else if (e == 'S') {
        DSV4_CHECK(!in_class, "pre-tokenizer regex: \\S inside a character class is not supported");
        out += "[^" + std::string(kSpaceInner) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = i;
    } else if (in_class && c == ']') {
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      const bool first = (i == class_start + 1) || (i == class_start + 2 && p[class_start + 1] == '^');
      if (!first) in_class = false;
    }
    out += c;
  }
  return out;
}

struct Pretokenizer::Step {
  pcre2_code* code = nullptr;
  bool remove_matches = false;  // behavior Removed (Isolated otherwise)
  ~Step() { pcre2_code_free(code); }
};

Pretokenizer::Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;
Pretokenizer::~Pretokenizer() = default;

static pcre2_code* compile_regex(const std::string& pattern, bool literal) {
  const std::string pat = literal ? pattern : onig_compatible_pattern(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer regex does not compile at offset ", off, ": ", reinterpret_cast<const char*>(msg),
         " (pattern: ", pattern, ")");
  }
  const int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  if (jit != 0) {
    pcre2_code_free(code);
    fail("pre-tokenizer regex: PCRE2 JIT compilation failed (", jit, ")");
  }
  return code;
}

std::unique_ptr<Pretokenizer::Step> Pretokenizer::make_step(const std::string& pattern, bool literal, bool remove) {
  auto s = std::make_unique<Step>();
  s->code = compile_regex(pattern, literal);
  s->remove_matches = remove;
  return s;
}

Pretokenizer Pretokenizer::from_regexes(const std::vector<std::string>& regexes) {
  Pretokenizer p;
  for (const auto& r : regexes) p.steps_.push_back(make_step(r, false, false));
  return p;
}

Pretokenizer Pretokenizer::from_json(const nlohmann::json& j) {
  Pretokenizer p;
  if (j.is_null()) return p;
  std::vector<const nlohmann::json*> flat;
  if (j.value("type", "") == "Sequence") {
    for (const auto& s : j.at("pretokenizers")) flat.push_back(&s);
  } else {
    flat.push_back(&j);
  }
  for (std::size_t i = 0; i < flat.size(); ++i) {
    const auto& s = *flat[i];
    const std::string type = s.value("type", "");
    if (type == "Split") {
      const auto& pat = s.at("pattern");
      const std::string behavior = s.value("behavior", "");
      DSV4_CHECK(behavior == "Isolated" || behavior == "Removed", "pre-tokenizer Split behavior '", behavior,
                 "' is not supported (only Isolated and Removed)");
      DSV4_CHECK(!s.value("invert", false), "pre-tokenizer Split with invert=true is not supported");
      if (pat.contains("Regex")) {
        p.steps_.push_back(make_step(pat.at("Regex").get<std::string>(), false, behavior == "Removed"));
      } else if (pat.contains("String")) {
        p.steps_.push_back(make_step(pat.at("String").get<std::string>(), true, behavior == "Removed"));
      } else {
        fail("pre-tokenizer Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
      }
    } else if (type == "ByteLevel") {
      // Only the byte<->char mapping; BPE here works on raw bytes, so nothing to do.
      DSV4_CHECK(i + 1 == flat.size(), "pre-tokenizer ByteLevel must be the last step");
      DSV4_CHECK(!s.value("add_prefix_space", false), "pre-tokenizer ByteLevel add_prefix_space=true is not supported");
      DSV4_CHECK(!s.value("use_regex", true), "pre-tokenizer ByteLevel use_regex=true is not supported");
    } else {
      fail("pre-tokenizer type '", type, "' is not supported (Sequence, Split, ByteLevel)");
    }
  }
  return p;
}

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  split_from(0, text, out);
}

void Pretokenizer::split_from(std::size_t level, std::string_view text, std::vector<std::string_view>& out) const {
  if (level == steps_.size()) {
    out.push_back(text);
    return;
  }
  const Step& st = *steps_[level];
  JitStack& js = thread_jit();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0, prev = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_jit_match(st.code, subj, text.size(), pos, PCRE2_NO_UTF_CHECK, js.md, js.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer regex match failed: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(js.md);
    const std::size_t s = ov[0], e = ov[1];
    if (s > prev) split_from(level + 1, text.substr(prev, s - prev), out);
    if (e > s) {
      if (!st.remove_matches) split_from(level + 1, text.substr(s, e - s), out);
      prev = pos = e;
    } else {
      // Empty match (never for the DeepSeek regexes): nothing to emit; step over one char.
      prev = s;
      if (s >= text.size()) break;
      std::size_t sub;
      bool trunc;
      const std::size_t len = utf8_seq_len(text.substr(s), &sub, &trunc);
      pos = s + (len ? len : 1);
    }
  }
  if (prev < text.size()) split_from(level + 1, text.substr(prev), out);
}

}  // namespace dsv4
