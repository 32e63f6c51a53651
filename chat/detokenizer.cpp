#include "chat/detokenizer.h"

#include "chat/utf8.h"

namespace dsv4 {

std::string StreamDetokenizer::push(TokenId id) {
  std::string out;
  const std::string_view b = tok_->token_bytes(id);  // throws on an unknown id
  if (skip_special_ && tok_->is_special(id)) return out;
  pending_.append(b);
  const std::size_t used = utf8_lossy_append(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDetokenizer::finish() {
  std::string out;
  utf8_lossy_append(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace dsv4
