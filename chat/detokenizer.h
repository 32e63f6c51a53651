// Incremental detokenizer for streaming: feed token ids one at a time, get text that is
// always valid UTF-8. Bytes of a multi-byte character split across tokens are held back
// until the character completes; ill-formed bytes become U+FFFD exactly as in
// Tokenizer::decode, so the concatenated stream equals decode() of all ids.
#pragma once
#include <string>

#include "chat/tokenizer.h"

namespace dsv4 {

class StreamDetokenizer {
 public:
  explicit StreamDetokenizer(const Tokenizer& tok, bool skip_special_tokens = false)
      : tok_(&tok), skip_special_(skip_special_tokens) {}

  // Text completed by this token (possibly empty).
  std::string push(TokenId id);
  // Flushes an unfinished trailing sequence (as U+FFFD); call once at end of stream.
  std::string finish();
  // Bytes currently held back (0..3).
  std::size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsv4
