// Tokenizer fuzz target: any bytes encode without error; decode(encode(x)) is x with
// invalid UTF-8 replaced; the streaming detokenizer agrees with decode and emits only
// valid UTF-8; arbitrary id sequences decode like the batch decoder.
#include <cstddef>
#include <cstdint>

#include "chat/detokenizer.h"
#include "chat/tokenizer.h"
#include "chat/utf8.h"
#include "core/error.h"
#include "fuzz_common.h"

static const dsv4::Tokenizer& tok() {
  static const dsv4::Tokenizer t = dsv4::Tokenizer::from_file(fuzz_source_dir() + "/models/tiny/tokenizer.json");
  return t;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto ids = tok().encode(in);
  FUZZ_ASSERT(tok().decode(ids) == dsv4::utf8_lossy(in));
  dsv4::StreamDetokenizer d(tok());
  std::string all;
  for (auto id : ids) {
    const std::string piece = d.push(id);
    FUZZ_ASSERT(dsv4::utf8_valid(piece));
    all += piece;
  }
  all += d.finish();
  FUZZ_ASSERT(all == tok().decode(ids));
  // Bytes as token ids (two bytes each), including out-of-range ones.
  std::vector<dsv4::TokenId> raw;
  for (size_t i = 0; i + 1 < size && raw.size() < 64; i += 2) raw.push_back((data[i] << 8 | data[i + 1]) % (tok().vocab_size() + 8));
  bool bad = false;
  for (auto id : raw) bad |= !tok().is_valid_id(id);
  try {
    const std::string s = tok().decode(raw, size & 1);
    FUZZ_ASSERT(!bad && dsv4::utf8_valid(s));
  } catch (const dsv4::Error&) {
    FUZZ_ASSERT(bad);
  }
  return 0;
}
