// UTF-8 helpers shared by the tokenizer (input sanitizing) and the detokenizer (output).
// Invalid input is never rejected: like Python's bytes.decode(errors="replace") and Rust's
// String::from_utf8_lossy, each maximal ill-formed subpart becomes one U+FFFD, so the C++
// tokenizer sees exactly the text HF `tokenizers` would be handed.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace dsv4 {

// Length of the well-formed sequence starting at s[0] (1..4), or 0 if s[0..] is ill-formed.
// `*subpart` receives the length of the maximal ill-formed subpart when 0 is returned
// (>= 1), and `*truncated` whether the ill-formed part is only an unfinished prefix cut by
// the end of `s` (so more bytes could still complete it).
std::size_t utf8_seq_len(std::string_view s, std::size_t* subpart, bool* truncated);

// True if `s` is entirely well-formed UTF-8.
bool utf8_valid(std::string_view s);

// Appends the lossy decoding of `s` to `out`. If `final` is false, a trailing unfinished
// (but so far valid) sequence is not converted; the number of bytes consumed is returned.
std::size_t utf8_lossy_append(std::string_view s, bool final, std::string& out);

// Lossy decoding of the whole of `s`.
std::string utf8_lossy(std::string_view s);

// Appends the UTF-8 encoding of code point `cp` (must be a scalar value).
void utf8_append(std::string& out, char32_t cp);

}  // namespace dsv4
